package idempotency_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

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

// pqDialer is a lib/pq Dialer over a dial function.
type pqDialer func(ctx context.Context, network, addr string) (net.Conn, error)

func (d pqDialer) Dial(network, addr string) (net.Conn, error) {
	return d(context.Background(), network, addr)
}

func (d pqDialer) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d(ctx, network, addr)
}

func (d pqDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return d(ctx, network, addr)
}

// TestSQLRoundTripsPerRequest is TestRoundTripsPerRequest for
// ModeTransactional over a SQLStore, the handler's one INSERT through
// SQLTxFromContext, on one database/sql connection:
//
//   - pgx's stdlib driver: BEGIN (database/sql's own); lock + read +
//     SAVEPOINT pipelined on the *pgx.Conn; the handler's INSERT; the
//     record; COMMIT (database/sql's own): five, where each statement on
//     its own would be seven. A replay: BEGIN, the pipeline, ROLLBACK.
//   - lib/pq: every statement on its own, and each with parameters is two
//     round trips (lib/pq prepares it unnamed, then binds and executes):
//     BEGIN 1, lock 2, read 2, SAVEPOINT 1, INSERT 2, record 2, COMMIT 1.
//     A replay: BEGIN, lock, read, SAVEPOINT, ROLLBACK.
func TestSQLRoundTripsPerRequest(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		driver            string
		fresh, replayWant int
	}{
		{"pgx", 5, 3},
		{"postgres", 11, 7},
	}
	for _, tt := range testCases {
		t.Run(tt.driver, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.MaxConns(1))
			if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE rt_row (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			counter := pgwire.NewCounter()
			var sdb *sql.DB
			switch tt.driver {
			case "pgx":
				cfg, err := pgx.ParseConfig(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				cfg.DialFunc = counter.DialFunc(nil)
				// No liveness ping when database/sql hands the connection
				// out again after a second idle: the count is the store's.
				sdb = stdlib.OpenDB(*cfg, stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return false }))
			case "postgres":
				c, err := pq.NewConnector(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				c.Dialer(pqDialer(counter.DialFunc(nil)))
				sdb = sql.OpenDB(c)
			}
			t.Cleanup(func() { _ = sdb.Close() })
			sdb.SetMaxOpenConns(1)
			mw := newMW(t, idempotency.NewSQLStore(sdb), idempotency.Config{Mode: idempotency.ModeTransactional, ReplayCacheBytes: -1})
			h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx, ok := idempotency.SQLTxFromContext(r.Context())
				if !ok {
					http.Error(w, "no *sql.Tx", http.StatusInternalServerError)
					return
				}
				var id int64
				if err := tx.QueryRowContext(r.Context(), `INSERT INTO rt_row (body) VALUES ($1) RETURNING id`, "row").Scan(&id); err != nil {
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
			// The first request of each kind prepares pgx's cached
			// statements: not counted.
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
