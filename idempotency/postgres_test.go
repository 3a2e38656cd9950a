package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

func countRows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAbandonedClaimTakeover: a handler that hangs past its context keeps
// the key (409) until the lease, no longer renewed, ends; then exactly one
// of many concurrent retries takes over, and the late original's
// completion is fenced out. The original's client gets 409 in progress,
// not the original's 201, and its retry gets the takeover's answer: one
// key, one success.
func TestAbandonedClaimTakeover(t *testing.T) {
	t.Parallel()
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := sc.new(t)
			ev := &events{}
			var runs atomic.Int64
			entered, release := make(chan struct{}), make(chan struct{})
			h := newMW(t, s, idempotency.Config{Lease: 300 * time.Millisecond, Hook: ev.hook}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					close(entered)
					<-release // hangs, ignoring its context, like a stuck process
					w.WriteHeader(201)
					io.WriteString(w, "original")
					return
				}
				w.WriteHeader(201)
				io.WriteString(w, "takeover")
			}))
			orig := make(chan *httptest.ResponseRecorder)
			go func() { orig <- do(h, post("/x", "alice", "k", `{}`)) }()
			<-entered
			if w := do(h, post("/x", "alice", "k", `{}`)); w.Code != 409 || problemCode(t, w) != idem.CodeKeyInProgress {
				t.Fatalf("during lease: %d %s", w.Code, w.Body)
			}
			// Retry until the lease ends, 8 clients at a time, as impatient
			// clients would.
			var mu sync.Mutex
			codes := map[int]int{}
			eventually(t, "takeover", func() bool {
				var wg sync.WaitGroup
				for range 8 {
					wg.Go(func() {
						w := do(h, post("/x", "alice", "k", `{}`))
						mu.Lock()
						if w.Header().Get(idem.HeaderReplayed) == "true" {
							codes[-w.Code]++ // replays of the takeover's response
						} else {
							codes[w.Code]++
						}
						mu.Unlock()
					})
				}
				wg.Wait()
				return runs.Load() >= 2
			})
			if runs.Load() != 2 || codes[201] != 1 || ev.count(idempotency.EventTakeover) != 1 {
				t.Fatalf("runs %d, codes %v, takeovers %d; want exactly one takeover", runs.Load(), codes, ev.count(idempotency.EventTakeover))
			}
			close(release)
			if w := <-orig; w.Code != 409 || problemCode(t, w) != idem.CodeKeyInProgress {
				t.Fatalf("fenced original got %d %q, want 409 %s", w.Code, w.Body, idem.CodeKeyInProgress)
			}
			if ev.count(idempotency.EventFenced) != 1 {
				t.Fatalf("fenced events %d, want the late original fenced out", ev.count(idempotency.EventFenced))
			}
			if w := do(h, post("/x", "alice", "k", `{}`)); w.Body.String() != "takeover" || w.Header().Get(idem.HeaderReplayed) != "true" {
				t.Fatalf("replay after takeover = %d %q, want the new owner's response", w.Code, w.Body)
			}
		})
	}
}

// TestTransactional: the handler's writes, the claim and the response commit
// together or not at all.
func TestTransactional(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) (*pgxpool.Pool, func(status int, panics bool) http.Handler) {
		db := testdb.New(t)
		if _, err := db.Pool.Exec(context.Background(), "CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text)"); err != nil {
			t.Fatal(err)
		}
		mw := newMW(t, idempotency.NewPostgresStore(db.Pool), idempotency.Config{Mode: idempotency.ModeTransactional})
		handler := func(status int, panics bool) http.Handler {
			return mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx, ok := idempotency.TxFromContext(r.Context())
				if !ok {
					t.Error("no transaction in context")
					return
				}
				var id int64
				if err := tx.QueryRow(r.Context(), "INSERT INTO orders (note) VALUES ('x') RETURNING id").Scan(&id); err != nil {
					t.Error(err)
				}
				if err := tx.Commit(r.Context()); !errors.Is(err, idempotency.ErrTxOwned) {
					t.Errorf("handler Commit = %v, want ErrTxOwned", err)
				}
				if panics {
					panic("after write")
				}
				w.WriteHeader(status)
				fmt.Fprintf(w, `{"id":%d}`, id)
			}))
		}
		return db.Pool, handler
	}
	t.Run("handler writes then fails: no rows at all", func(t *testing.T) {
		t.Parallel()
		pool, handler := setup(t)
		if w := do(handler(500, false), post("/orders", "alice", "k", `{}`)); w.Code != 500 {
			t.Fatalf("status %d", w.Code)
		}
		func() {
			defer func() { _ = recover() }()
			do(handler(201, true), post("/orders", "alice", "k2", `{}`))
		}()
		if n, m := countRows(t, pool, "orders"), countRows(t, pool, "idempotency_key"); n != 0 || m != 0 {
			t.Fatalf("orders %d, idempotency_key %d; want none", n, m)
		}
	})
	t.Run("success commits all together once", func(t *testing.T) {
		t.Parallel()
		pool, handler := setup(t)
		h := handler(201, false)
		w1 := do(h, post("/orders", "alice", "k", `{}`))
		w2 := do(h, post("/orders", "alice", "k", `{}`))
		if w1.Code != 201 || w2.Body.String() != w1.Body.String() {
			t.Fatalf("first %d %q, replay %q", w1.Code, w1.Body, w2.Body)
		}
		if n, m := countRows(t, pool, "orders"), countRows(t, pool, "idempotency_key"); n != 1 || m != 1 {
			t.Fatalf("orders %d, idempotency_key %d; want 1 and 1", n, m)
		}
	})
	t.Run("second request does not wait on the first's open transaction", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t)
		mw := newMW(t, idempotency.NewPostgresStore(db.Pool), idempotency.Config{Mode: idempotency.ModeTransactional})
		entered, gate := make(chan struct{}), make(chan struct{})
		h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-gate
			w.WriteHeader(201)
		}))
		first := make(chan int)
		go func() { first <- do(h, post("/x", "alice", "k", `{}`)).Code }()
		<-entered
		// Would block until gate closes if the claim waited on the row lock.
		w := do(h, post("/x", "alice", "k", `{}`))
		close(gate)
		if w.Code != 409 || problemCode(t, w) != idem.CodeKeyInProgress || <-first != 201 {
			t.Fatalf("second = %d %s", w.Code, w.Body)
		}
	})
}

// TestStoreDown: a store that cannot answer fails closed with 503, and the
// handler does not run.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.ModeTwoStep, idempotency.ModeTransactional} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
			if err != nil {
				t.Fatal(err)
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			var runs atomic.Int64
			ev := &events{}
			h := newMW(t, idempotency.NewPostgresStore(pool), idempotency.Config{Mode: mode, Hook: ev.hook}).Wrap(created(&runs))
			w := do(h, post("/x", "alice", "k", `{}`))
			if w.Code != 503 || problemCode(t, w) != idem.CodeStoreUnavailable || runs.Load() != 0 || ev.count(idempotency.EventStoreError) != 1 {
				t.Fatalf("status %d %s, runs %d", w.Code, w.Body, runs.Load())
			}
		})
	}
}

// TestRouting: the route in the scope is the router's pattern, with
// net/http.ServeMux and with chi.
func TestRouting(t *testing.T) {
	t.Parallel()
	s := idempotency.NewMemoryStore()
	var runs atomic.Int64
	echoRoute := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(201)
		io.WriteString(w, r.Pattern)
	})
	mw := newMW(t, s, idempotency.Config{})

	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}/confirm", mw.Wrap(echoRoute))
	mux.Handle("POST /payments", mw.Wrap(echoRoute))

	r := chi.NewRouter()
	r.With(mw.Wrap).Post("/chi/orders/{id}/confirm", echoRoute)
	r.With(mw.Wrap).Post("/chi/payments", echoRoute)

	for _, tt := range []struct {
		name           string
		h              http.Handler
		confirm1, pay  string
		confirm2       string
		wantPatternOne string
	}{
		{"ServeMux", mux, "/orders/1/confirm", "/payments", "/orders/2/confirm", "POST /orders/{id}/confirm"},
		{"chi", r, "/chi/orders/1/confirm", "/chi/payments", "/chi/orders/2/confirm", "/chi/orders/{id}/confirm"},
	} {
		before := runs.Load()
		w1 := do(tt.h, post(tt.confirm1, "alice", "k-"+tt.name, `{}`))
		if w1.Code != 201 || w1.Body.String() != tt.wantPatternOne {
			t.Fatalf("%s: %d %q", tt.name, w1.Code, w1.Body)
		}
		// Same key on another route: independent.
		if w := do(tt.h, post(tt.pay, "alice", "k-"+tt.name, `{}`)); w.Code != 201 || w.Header().Get(idem.HeaderReplayed) != "" {
			t.Fatalf("%s: other route %d %v", tt.name, w.Code, w.Header())
		}
		// Same key, same route pattern, other path: the path is in the
		// fingerprint, so it is a reuse, not a replay.
		if w := do(tt.h, post(tt.confirm2, "alice", "k-"+tt.name, `{}`)); w.Code != 409 || problemCode(t, w) != idem.CodeKeyReused {
			t.Fatalf("%s: same route other path %d %s", tt.name, w.Code, w.Body)
		}
		if w := do(tt.h, post(tt.confirm1, "alice", "k-"+tt.name, `{}`)); w.Header().Get(idem.HeaderReplayed) != "true" {
			t.Fatalf("%s: no replay", tt.name)
		}
		if runs.Load()-before != 2 {
			t.Fatalf("%s: runs %d", tt.name, runs.Load()-before)
		}
	}
}

// TestPurgeLoop: Start purges expired records in batches; Stop is safe twice
// and before Start.
func TestPurgeLoop(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	s := idempotency.NewPostgresStore(db.Pool)
	ctx := context.Background()
	for i := range 7 {
		c := claimOf(fmt.Sprint("old", i), "a", time.Millisecond, time.Millisecond)
		r, err := s.Claim(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, c.Key, r.Fence, &idempotency.Response{Status: 201}, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Claim(ctx, claimOf("live", "a", time.Hour, time.Hour)); err != nil {
		t.Fatal(err)
	}
	mw := newMW(t, s, idempotency.Config{PurgeInterval: 5 * time.Millisecond, PurgeBatchSize: 2})
	if err := mw.Stop(ctx); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	if err := mw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_ = mw.Start(ctx)
	eventually(t, "purge", func() bool { return countRows(t, db.Pool, "idempotency_key") == 1 })
	if err := mw.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mw.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPurgeRacesTakeovers: purgers deleting expired records by batch race
// requests that take the same expired keys over and complete them; a
// purge may take a key before its takeover (which then claims it fresh)
// but never a record that was taken over: every key ends up holding its
// new response.
func TestPurgeRacesTakeovers(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	s := idempotency.NewPostgresStore(db.Pool)
	ctx := context.Background()
	const keys = 300
	for i := range keys {
		c := claimOf(fmt.Sprint("k", i), "old", time.Millisecond, time.Millisecond)
		r, err := s.Claim(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, c.Key, r.Fence, &idempotency.Response{Status: 201, Body: []byte("old")}, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every record expired", func() bool {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_key WHERE expires_at <= now()`).Scan(&n)
		return err == nil && n == keys
	})
	var wg sync.WaitGroup
	var purged atomic.Int64
	done := make(chan struct{})
	for range 3 {
		wg.Go(func() {
			for {
				n, err := s.Purge(ctx, 7)
				if err != nil {
					t.Error(err)
					return
				}
				purged.Add(int64(n))
				select {
				case <-done:
					return
				default:
				}
			}
		})
	}
	var takers sync.WaitGroup
	for w := range 6 {
		takers.Go(func() {
			for i := w; i < keys; i += 6 {
				c := claimOf(fmt.Sprint("k", i), "new", time.Hour, time.Hour)
				r, err := s.Claim(ctx, c)
				if err != nil || (r.Outcome != idempotency.OutcomeClaimed && r.Outcome != idempotency.OutcomeTookOver) {
					t.Errorf("key %d: claim %+v, %v", i, r, err)
					continue
				}
				if err := s.Complete(ctx, c.Key, r.Fence, &idempotency.Response{Status: 201, Body: []byte(fmt.Sprint("new", i))}, time.Hour); err != nil {
					t.Errorf("key %d: complete: %v", i, err)
				}
			}
		})
	}
	takers.Wait()
	close(done)
	wg.Wait()
	if p := purged.Load(); p > keys {
		t.Errorf("purged %d of %d expired records", p, keys)
	}
	for i := range keys {
		r, err := s.Claim(ctx, claimOf(fmt.Sprint("k", i), "new", time.Hour, time.Hour))
		if err != nil || r.Outcome != idempotency.OutcomeCompleted || r.Response == nil || string(r.Response.Body) != fmt.Sprint("new", i) {
			t.Fatalf("key %d after the race: %+v, %v; want its new response", i, r, err)
		}
	}
	if n := countRows(t, db.Pool, "idempotency_key"); n != keys {
		t.Errorf("%d records, want %d", n, keys)
	}
}

// TestNewValidates: a bad Config is an error naming the field.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	s := idempotency.NewMemoryStore()
	for _, tt := range []struct {
		cfg  *idempotency.Config
		want string
	}{
		{nil, "Scope"},
		{&idempotency.Config{}, "Scope"},
		{&idempotency.Config{Scope: principal, MismatchStatus: 400}, "MismatchStatus"},
		{&idempotency.Config{Scope: principal, Lease: -1}, "Lease"},
		{&idempotency.Config{Scope: principal, ReplayHeaders: []string{"set-cookie"}}, "ReplayHeaders"},
		{&idempotency.Config{Scope: principal, Mode: idempotency.ModeTransactional}, "TxStore"},
		{&idempotency.Config{Scope: principal, Lease: time.Hour, Retention: time.Minute}, "Retention"},
	} {
		_, err := idempotency.New(s, tt.cfg)
		if err == nil || !contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// blockingPurge holds every Purge until release is closed or its context
// ends.
type blockingPurge struct {
	idempotency.Store
	entered chan struct{}
	release chan struct{}
}

func (s *blockingPurge) Purge(ctx context.Context, limit int) (int, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	select {
	case <-s.release:
		return s.Store.Purge(ctx, limit)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// TestPurgeLoopStartStop: the purge loop follows internal/startstop: Stop
// lets the batch in hand finish (and waits for it, or for its own ctx),
// HardStop cancels it, Start after a stop is a fresh run, and every round
// is reported as EventPurge.
func TestPurgeLoopStartStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var purged atomic.Int64
	var errs sync.Map
	hook := func(ctx context.Context, e idempotency.Event) context.Context {
		if e.Kind == idempotency.EventPurge {
			purged.Add(int64(e.Purged))
			if e.Err != nil {
				errs.Store(e.Err.Error(), e.Err)
			}
		}
		return ctx
	}
	s := &blockingPurge{Store: idempotency.NewMemoryStore(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	mw := newMW(t, s, idempotency.Config{PurgeInterval: time.Hour, Hook: hook})

	// Soft stop with a batch in hand: Stop's own deadline passes while the
	// batch still runs; once the batch is let go, Stop returns.
	if err := mw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-s.entered
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := mw.Stop(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop while a batch is in hand: %v, want its own deadline (the batch finishes)", err)
	}
	close(s.release)
	if err := mw.Stop(ctx); err != nil {
		t.Fatalf("Stop once the batch finished: %v", err)
	}

	// A fresh run after the stop purges what expired meanwhile.
	for i := range 3 {
		c := claimOf(fmt.Sprint("old", i), "a", time.Millisecond, time.Millisecond)
		r, err := s.Claim(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, c.Key, r.Fence, &idempotency.Response{Status: 201}, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	// A probe written after them tells, in the store's clock, that they
	// have expired: once it can be claimed afresh, so could they.
	probe := claimOf("probe", "a", time.Millisecond, time.Millisecond)
	if _, err := s.Claim(ctx, probe); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the records to expire", func() bool {
		r, err := s.Claim(ctx, claimOf("probe", "other", time.Hour, time.Hour))
		return err == nil && r.Outcome == idempotency.OutcomeClaimed
	})
	before := purged.Load()
	if err := mw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the fresh run to purge", func() bool { return purged.Load() == before+3 })
	if err := mw.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// HardStop abandons the batch in hand.
	hs := &blockingPurge{Store: idempotency.NewMemoryStore(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	mw2 := newMW(t, hs, idempotency.Config{PurgeInterval: time.Hour, Hook: hook})
	if err := mw2.HardStop(ctx); err != nil {
		t.Fatalf("HardStop before Start: %v", err)
	}
	if err := mw2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-hs.entered
	if err := mw2.HardStop(ctx); err != nil {
		t.Fatalf("HardStop with a batch in hand: %v", err)
	}
	if err := mw2.HardStop(ctx); err != nil {
		t.Fatalf("second HardStop: %v", err)
	}
	found := false
	errs.Range(func(_, v any) bool {
		found = found || errors.Is(v.(error), context.Canceled)
		return true
	})
	if !found {
		t.Fatal("the abandoned batch was not reported as an EventPurge with context.Canceled")
	}
}
