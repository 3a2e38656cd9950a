package idempotency_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

// TestSQLTransactional is ModeTransactional over a SQLStore on each
// database/sql driver: the handler writes through SQLTxFromContext; 50
// concurrent requests with one key run it once and leave one order; a 5xx
// rolls its write and the claim back; a handler statement that fails and
// is answered with a definitive 409 gets that 409 stored and replayed
// without its write; a success after a failed statement commits nothing.
func TestSQLTransactional(t *testing.T) {
	t.Parallel()
	for _, driver := range testdb.SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.MaxConns(2))
			ctx := t.Context()
			if _, err := db.Pool.Exec(ctx, "CREATE TABLE orders (key text PRIMARY KEY, n int NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			sdb := db.SQL(t, driver, 20)
			var runs atomic.Int64
			mw := newMW(t, idempotency.NewSQLStore(sdb), idempotency.Config{Mode: idempotency.ModeTransactional})
			h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				if _, ok := idempotency.TxFromContext(r.Context()); ok {
					http.Error(w, "a pgx.Tx over a SQLStore", http.StatusInternalServerError)
					return
				}
				tx, ok := idempotency.SQLTxFromContext(r.Context())
				if !ok {
					http.Error(w, "no *sql.Tx", http.StatusInternalServerError)
					return
				}
				q := r.URL.Query()
				_, err := tx.ExecContext(r.Context(), "INSERT INTO orders VALUES ($1, 1)", q.Get("order"))
				switch {
				case err != nil && strings.Contains(err.Error(), "23505") || err != nil && strings.Contains(err.Error(), "duplicate key"):
					if q.Get("lie") != "" {
						w.WriteHeader(http.StatusCreated)
						return
					}
					w.WriteHeader(http.StatusConflict)
					fmt.Fprint(w, `{"error":"order exists"}`)
				case err != nil:
					http.Error(w, err.Error(), http.StatusInternalServerError)
				case q.Get("fail") != "":
					http.Error(w, "boom", http.StatusInternalServerError)
				default:
					w.WriteHeader(http.StatusCreated)
					fmt.Fprint(w, `{"order":"`+q.Get("order")+`"}`)
				}
			}))

			// 50 racers, one key: one execution, one order, the others
			// in progress or the replay.
			var wg sync.WaitGroup
			codes := make(chan int, 50)
			start := make(chan struct{})
			for range 50 {
				wg.Go(func() {
					<-start
					codes <- do(h, post("/orders?order=o1", "alice", "race", `{}`)).Code
				})
			}
			close(start)
			wg.Wait()
			close(codes)
			created := 0
			for c := range codes {
				switch c {
				case http.StatusCreated:
					created++
				case http.StatusConflict:
				default:
					t.Fatalf("racer got %d", c)
				}
			}
			if runs.Load() != 1 || countRows(t, db.Pool, "orders") != 1 || created < 1 {
				t.Fatalf("50 racers: %d runs, %d orders, %d created; want one run and one order", runs.Load(), countRows(t, db.Pool, "orders"), created)
			}
			if w := do(h, post("/orders?order=o1", "alice", "race", `{}`)); w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "true" || w.Body.String() != `{"order":"o1"}` {
				t.Fatalf("replay: %d %q %s", w.Code, w.Header().Get(idem.HeaderReplayed), w.Body)
			}

			// A 5xx rolls the write and the claim back: the retry runs afresh.
			runs.Store(0)
			if w := do(h, post("/orders?order=o2&fail=1", "alice", "k5", `{}`)); w.Code != http.StatusInternalServerError {
				t.Fatalf("failing handler: %d", w.Code)
			}
			if n := countRows(t, db.Pool, "orders"); n != 1 {
				t.Fatalf("orders after a 5xx: %d, want its write rolled back", n)
			}
			if w := do(h, post("/orders?order=o2", "alice", "k5", `{}`)); w.Code != http.StatusCreated || runs.Load() != 2 {
				t.Fatalf("retry after a 5xx: %d after %d runs, want a fresh 201", w.Code, runs.Load())
			}

			// A failed statement answered 409: stored and replayed, no write.
			runs.Store(0)
			w1 := do(h, post("/orders?order=o1", "alice", "k409", `{}`))
			w2 := do(h, post("/orders?order=o1", "alice", "k409", `{}`))
			if w1.Code != http.StatusConflict || w1.Body.String() != `{"error":"order exists"}` {
				t.Fatalf("duplicate order: %d %s, want the handler's 409", w1.Code, w1.Body)
			}
			if w2.Code != http.StatusConflict || w2.Header().Get(idem.HeaderReplayed) != "true" || w2.Body.String() != w1.Body.String() || runs.Load() != 1 {
				t.Fatalf("retry of the 409: %d %s replayed=%q runs=%d, want the stored 409", w2.Code, w2.Body, w2.Header().Get(idem.HeaderReplayed), runs.Load())
			}

			// A success after a failed statement: 500 TX_ABORTED, key free.
			w3 := do(h, post("/orders?order=o1&lie=1", "alice", "klie", `{}`))
			if w3.Code != http.StatusInternalServerError || problemCode(t, w3) != idem.CodeTxAborted {
				t.Fatalf("success over a failed statement: %d %s", w3.Code, w3.Body)
			}
			if n := countRows(t, db.Pool, "orders"); n != 2 {
				t.Fatalf("orders = %d, want 2", n)
			}
		})
	}
}

// A handler that ends the request's *sql.Tx itself is reported, never
// answered with its own success: the record could not be written.
func TestSQLTransactionalHandlerEndsTx(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.MaxConns(2))
	sdb := db.SQL(t, "pgx", 4)
	ev := &events{}
	mw := newMW(t, idempotency.NewSQLStore(sdb), idempotency.Config{Mode: idempotency.ModeTransactional, Hook: ev.hook})
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.SQLTxFromContext(r.Context())
		_ = tx.Rollback()
		w.WriteHeader(http.StatusCreated)
	}))
	w := do(h, post("/x", "alice", "k", `{}`))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("handler that rolled back the request's tx: %d, want 503", w.Code)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	found := false
	for _, e := range ev.ev {
		found = found || errors.Is(e.Err, idempotency.ErrTxOwned)
	}
	if !found {
		t.Fatal("no hook event with ErrTxOwned")
	}
}

// TestSQLStoreConnReturned: on either driver, every end of a transactional
// claim hands its connection back to the *sql.DB (on pgx's stdlib driver
// the claim runs on a dedicated *sql.Conn, see SQLStore.BeginClaim): a
// commit, a rollback, a claim of a completed key (not ours, ended at
// once) and a claim whose statements fail, each on a pool of one
// connection, which a leaked or still-open connection would starve.
func TestSQLStoreConnReturned(t *testing.T) {
	t.Parallel()
	for _, driver := range testdb.SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			claim := func(key string) idempotency.Claim {
				return idempotency.Claim{Key: idempotency.KeyHash(sha256.Sum256([]byte(key))), Lease: time.Minute, Retention: time.Hour}
			}
			sdb := testdb.New(t, testdb.MaxConns(1)).SQL(t, driver, 1)
			s := idempotency.NewSQLStore(sdb)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a starved pool fails here, not hangs
			defer cancel()
			for i := range 3 {
				tx, res, err := s.BeginClaim(ctx, claim("k"+strconv.Itoa(i)))
				if err != nil || res.Outcome != idempotency.OutcomeClaimed {
					t.Fatalf("claim %d: %v %s", i, err, res.Outcome)
				}
				if err := tx.Commit(ctx, &idempotency.Response{Status: 201}, time.Hour); err != nil {
					t.Fatalf("commit %d: %v", i, err)
				}
				if tx, res, err := s.BeginClaim(ctx, claim("k"+strconv.Itoa(i))); err != nil || tx != nil || res.Outcome != idempotency.OutcomeCompleted {
					t.Fatalf("claim of completed key %d: %v %v %s", i, err, tx, res.Outcome)
				}
				tx, _, err = s.BeginClaim(ctx, claim("r"+strconv.Itoa(i)))
				if err != nil {
					t.Fatalf("claim r%d: %v", i, err)
				}
				if err := tx.Rollback(ctx); err != nil {
					t.Fatalf("rollback %d: %v", i, err)
				}
			}
			if got := sdb.Stats().InUse; got != 0 {
				t.Fatalf("%d connections in use after the claims ended, want 0", got)
			}
			// A claim whose statements fail (no table) also gives its
			// connection back, out of any transaction.
			if _, err := sdb.ExecContext(ctx, "ALTER TABLE idempotency_key RENAME TO idempotency_key_gone"); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if _, _, err := s.BeginClaim(ctx, claim("gone")); err == nil || !strings.Contains(err.Error(), "idempotency_key") {
					t.Fatalf("claim without its table: %v, want the missing relation", err)
				}
			}
			// (In the aborted transaction of a failed claim this would
			// fail with 25P02.)
			if _, err := sdb.ExecContext(ctx, "SELECT 1"); err != nil {
				t.Fatalf("after failed claims: %v", err)
			}
			if got := sdb.Stats().InUse; got != 0 {
				t.Fatalf("%d connections in use after failed claims, want 0", got)
			}
		})
	}
}

// TestSQLStoreFullPoolHonoursCtx: on a pool whose one connection is busy,
// a claim waits for a connection only as long as its ctx lets it (on
// every driver): the transaction itself is begun without ctx's
// cancellation, the wait for its connection is not.
func TestSQLStoreFullPoolHonoursCtx(t *testing.T) {
	t.Parallel()
	for _, driver := range testdb.SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			sdb := testdb.New(t, testdb.MaxConns(1)).SQL(t, driver, 1)
			s := idempotency.NewSQLStore(sdb)
			claim := func(key string) idempotency.Claim {
				return idempotency.Claim{Key: idempotency.KeyHash(sha256.Sum256([]byte(key))), Lease: time.Minute, Retention: time.Hour}
			}
			// A first claim, so that the store knows its driver (pgx's
			// stdlib or not), then the pool's one connection held.
			tx, _, err := s.BeginClaim(t.Context(), claim("first"))
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(t.Context()); err != nil {
				t.Fatal(err)
			}
			busy, err := sdb.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = busy.Rollback() }()
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				tx, _, err := s.BeginClaim(ctx, claim("starved"))
				if tx != nil {
					_ = tx.Rollback(context.Background())
				}
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("claim on a full pool: %v, want its ctx's deadline", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("claim on a full pool still waiting 20 s after its ctx ended")
			}
		})
	}
}
