package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/pgwire"
	"github.com/idemkit/idem/internal/testdb"
)

// rowDB is what the test handler writes its row through: the pool or the
// connection the store runs on.
type rowDB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TestRoundTripsPerRequest pins, at wire level, the round trips one
// request costs: every frontend message of the store's connections goes
// through a pgwire.Counter. A fresh request whose handler runs one
// statement costs three, in either mode and over a pool or a single
// connection:
//
//   - two-step: the claim; the handler's INSERT; the completion;
//   - transactional: BEGIN + lock + read + SAVEPOINT; the handler's INSERT
//     (in the request transaction); the record + COMMIT.
//
// A replay (replay cache off) costs one in two-step (the claim statement
// reads the record) and two in transactional (the claim's pipeline, then
// the ROLLBACK that ends the transaction it opened).
func TestRoundTripsPerRequest(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name              string
		mode              idempotency.Mode
		overConn          bool // a *pgx.Conn instead of a *pgxpool.Pool
		fresh, replayWant int
	}{
		{"two-step/pool", idempotency.ModeTwoStep, false, 3, 1},
		{"transactional/pool", idempotency.ModeTransactional, false, 3, 2},
		{"two-step/conn", idempotency.ModeTwoStep, true, 3, 1},
		{"transactional/conn", idempotency.ModeTransactional, true, 3, 2},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.MaxConns(1))
			if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE rt_row (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			counter := pgwire.NewCounter()
			var (
				store *idempotency.PostgresStore
				rows  rowDB
			)
			if tt.overConn {
				cfg, err := pgx.ParseConfig(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				cfg.DialFunc = counter.DialFunc(nil)
				conn, err := pgx.ConnectConfig(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = conn.Close(context.Background()) })
				store, rows = idempotency.NewPostgresStore(conn), conn
			} else {
				cfg, err := pgxpool.ParseConfig(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				cfg.ConnConfig.DialFunc = counter.DialFunc(nil)
				// One connection, and no liveness ping on Acquire (pgxpool
				// pings a connection idle for over a second): the count is
				// the middleware's, not the pool's housekeeping.
				cfg.MaxConns = 1
				cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
				pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				store, rows = idempotency.NewPostgresStore(pool), pool
			}
			mw := newMW(t, store, idempotency.Config{Mode: tt.mode, ReplayCacheBytes: -1})
			h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var q rowDB = rows
				if tx, ok := idempotency.TxFromContext(r.Context()); ok {
					q = tx
				}
				var id int64
				if err := q.QueryRow(r.Context(), `INSERT INTO rt_row (body) VALUES ($1) RETURNING id`, "row").Scan(&id); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"id":%d}`, id)
			}))
			send := func(key string, replayed bool) {
				t.Helper()
				w := do(h, post("/rows", "alice", key, `{"a":1}`))
				if w.Code != http.StatusCreated || (w.Header().Get("Idempotent-Replayed") == "true") != replayed {
					t.Fatalf("key %s: status %d, replayed %q: %s", key, w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
				}
			}
			// The first request of each kind prepares its statements (one
			// more round trip each, once per connection): not counted.
			send("warm", false)
			send("warm", true)
			const n = 3
			counter.Reset()
			for i := range n {
				send("fresh-"+strconv.Itoa(i), false)
			}
			if got := counter.Counts(); got.RoundTrips != n*tt.fresh {
				t.Errorf("%d fresh requests: %d round trips, want %d (%d each); messages %s", n, got.RoundTrips, n*tt.fresh, tt.fresh, messages(got))
			}
			counter.Reset()
			for i := range n {
				send("fresh-"+strconv.Itoa(i), true)
			}
			if got := counter.Counts(); got.RoundTrips != n*tt.replayWant {
				t.Errorf("%d replays: %d round trips, want %d (%d each); messages %s", n, got.RoundTrips, n*tt.replayWant, tt.replayWant, messages(got))
			}
			var count int
			if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM rt_row`).Scan(&count); err != nil {
				t.Fatal(err)
			}
			if count != n+1 {
				t.Fatalf("%d rows written, want %d: a handler ran twice or its write was lost", count, n+1)
			}
		})
	}
}

// messages lists a count's frontend messages by type.
func messages(c pgwire.Counts) string {
	s := ""
	for _, typ := range []byte("QPBDESCH") {
		if c.Messages[typ] > 0 {
			s += fmt.Sprintf("%c=%d ", typ, c.Messages[typ])
		}
	}
	return fmt.Sprintf("[%ssyncs=%d queries=%d]", s, c.Syncs, c.Queries)
}
