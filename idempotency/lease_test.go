package idempotency_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

// TestHandlerContextEndsWhileLeaseLive: the handler's context ends while
// the claim's lease is still live in the store, also with no heartbeat
// getting through. Before, the deadline was set Lease after Claim returned
// while the lease had started in the database before: a handler that
// honoured its context to the letter still outlived its lease by the
// claim's round trip, and a retry could take over while it ran. Whether
// the lease is live is asked of the store itself (a renewal succeeds only
// on a live lease), in its own clock.
func TestHandlerContextEndsWhileLeaseLive(t *testing.T) {
	t.Parallel()
	type setup struct {
		store     idempotency.Store // what the middleware uses
		direct    idempotency.Store // the same records, never partitioned
		partition func()
		heal      func()
	}
	for _, tt := range []struct {
		name      string
		partition bool
		new       func(t *testing.T) setup
	}{
		{"postgres, heartbeat reaches the store", false, func(t *testing.T) setup {
			db := testdb.New(t)
			return setup{idempotency.NewPostgresStore(db.Pool), idempotency.NewPostgresStore(db.Pool), func() {}, func() {}}
		}},
		{"postgres, network partitioned after the claim", true, func(t *testing.T) setup {
			db := testdb.New(t)
			pool, proxy := poolThrough(t, db)
			return setup{idempotency.NewPostgresStore(pool), idempotency.NewPostgresStore(db.Pool), proxy.Partition, proxy.Heal}
		}},
		{"memory, every renewal fails", true, func(t *testing.T) setup {
			s := idempotency.NewMemoryStore()
			return setup{failRenew{s}, s, func() {}, func() {}}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := tt.new(t)
			const lease = 2 * time.Second
			cfg := idempotency.Config{Lease: lease}
			if tt.partition {
				cfg.HandlerTimeout = time.Minute // only the heartbeat can end the handler
			}
			ev := &events{}
			cfg.Hook = ev.hook
			type seen struct {
				live  error
				cause error
			}
			got := make(chan seen, 1)
			key := idempotency.HashKey("alice", http.MethodPost, "/x", "k")
			h := newMW(t, st.store, cfg).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				st.partition()
				<-r.Context().Done()
				got <- seen{st.direct.Renew(context.Background(), key, ev.fence(idempotency.EventClaim), lease), context.Cause(r.Context())}
				st.heal()
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			do(h, post("/x", "alice", "k", `{}`))
			s := <-got
			if s.live != nil {
				t.Fatalf("the handler's context ended (cause %v) when its lease was no longer live in the store: %v", s.cause, s.live)
			}
			if tt.partition && (!errors.Is(s.cause, idempotency.ErrLeaseLost) || ev.count(idempotency.EventLeaseLost) != 1) {
				t.Fatalf("cause %v, %d lease_lost events; want ErrLeaseLost and one event", s.cause, ev.count(idempotency.EventLeaseLost))
			}
		})
	}
}

// failRenew is a store whose renewals never get through, as a store behind
// a partition; everything else works.
type failRenew struct{ idempotency.Store }

var errPartitioned = errors.New("test: store unreachable")

func (failRenew) Renew(context.Context, idempotency.KeyHash, int64, time.Duration) error {
	return errPartitioned
}

// TestSlowHandlerKeepsItsKey: a handler that runs past its initial lease
// keeps the key while its heartbeat renews the lease: retries after the
// initial lease would have run out (a probe claimed with the same lease
// just after it has been taken over) still get in progress, and the handler
// runs once. Before there was no renewal: the retry took over, and both
// runs answered 201.
func TestSlowHandlerKeepsItsKey(t *testing.T) {
	t.Parallel()
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := sc.new(t)
			const lease = 2 * time.Second
			var runs atomic.Int64
			entered, release := make(chan struct{}), make(chan struct{})
			ctxErr := make(chan error, 1)
			h := newMW(t, s, idempotency.Config{Lease: lease, HandlerTimeout: time.Minute}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					close(entered)
					<-release
					ctxErr <- r.Context().Err()
				}
				w.WriteHeader(201)
				io.WriteString(w, "slow")
			}))
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- do(h, post("/x", "alice", "k", `{}`)) }()
			<-entered
			probe := claimOf("probe", "p", lease, time.Hour)
			if _, err := s.Claim(t.Context(), probe); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the probe's lease to run out", func() bool {
				res, err := s.Claim(t.Context(), probe)
				if err != nil {
					t.Fatal(err)
				}
				return res.Outcome == idempotency.OutcomeTookOver
			})
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					if w := do(h, post("/x", "alice", "k", `{}`)); w.Code != http.StatusConflict || problemCode(t, w) != idem.CodeKeyInProgress {
						t.Errorf("retry past the initial lease: %d %s, want 409 %s", w.Code, w.Body, idem.CodeKeyInProgress)
					}
				})
			}
			wg.Wait()
			close(release)
			if err := <-ctxErr; err != nil {
				t.Fatalf("the slow handler's context ended: %v", err)
			}
			if w := <-first; w.Code != 201 || w.Body.String() != "slow" {
				t.Fatalf("slow handler answered %d %q", w.Code, w.Body)
			}
			if w := do(h, post("/x", "alice", "k", `{}`)); w.Header().Get(idem.HeaderReplayed) != "true" || runs.Load() != 1 {
				t.Fatalf("after: %d %q replayed=%q, runs %d; want the replay and one run", w.Code, w.Body, w.Header().Get(idem.HeaderReplayed), runs.Load())
			}
		})
	}
}

// TestFencedOriginalDoesNotAnswerSuccess: instance A's store is partitioned
// while its handler runs. The heartbeat cannot renew, so the handler's
// context ends before the lease does; this handler ignores it. After the
// lease has run out, a retry on instance B takes over and succeeds. When
// A's handler finally returns 201, its completion is fenced out, and A
// answers 409 IDEMPOTENCY_KEY_IN_PROGRESS instead of its own 201: a client
// never holds two different successes for one key. Its retry gets B's
// stored answer. Before, A sent its own 201 as well.
func TestFencedOriginalDoesNotAnswerSuccess(t *testing.T) {
	t.Parallel()
	type instances struct {
		a, b      idempotency.Store
		partition func()
		heal      func()
	}
	for _, tt := range []struct {
		name string
		new  func(t *testing.T) instances
	}{
		{"postgres, network partition", func(t *testing.T) instances {
			db := testdb.New(t)
			pool, proxy := poolThrough(t, db)
			return instances{idempotency.NewPostgresStore(pool), idempotency.NewPostgresStore(db.Pool), proxy.Partition, proxy.Heal}
		}},
		{"memory, renewals fail", func(t *testing.T) instances {
			s := idempotency.NewMemoryStore()
			fr := &switchStore{Store: s}
			return instances{fr, s, func() { fr.failing.Store(true) }, func() { fr.failing.Store(false) }}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := tt.new(t)
			cfg := idempotency.Config{Lease: time.Second, HandlerTimeout: time.Minute}
			evA := &events{}
			cfgA := cfg
			cfgA.Hook = evA.hook
			var runs atomic.Int64
			entered, lost, release := make(chan struct{}), make(chan error, 1), make(chan struct{})
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					in.partition()
					close(entered)
					<-r.Context().Done()
					lost <- context.Cause(r.Context())
					<-release // a handler that goes on regardless
					w.WriteHeader(201)
					io.WriteString(w, "original")
					return
				}
				w.WriteHeader(201)
				io.WriteString(w, "takeover")
			})
			ha := newMW(t, in.a, cfgA).Wrap(handler)
			hb := newMW(t, in.b, cfg).Wrap(handler)
			orig := make(chan *httptest.ResponseRecorder)
			go func() { orig <- do(ha, post("/x", "alice", "k", `{}`)) }()
			<-entered
			if err := <-lost; !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Fatalf("the partitioned handler's context ended with %v, want ErrLeaseLost", err)
			}
			var took *httptest.ResponseRecorder
			eventually(t, "a takeover on instance B", func() bool {
				w := do(hb, post("/x", "alice", "k", `{}`))
				if w.Code == http.StatusConflict && problemCode(t, w) == idem.CodeKeyInProgress {
					return false
				}
				took = w
				return true
			})
			if took.Code != 201 || took.Body.String() != "takeover" {
				t.Fatalf("retry on B: %d %q, want the takeover's 201", took.Code, took.Body)
			}
			in.heal()
			close(release)
			w := <-orig
			if w.Code != http.StatusConflict || problemCode(t, w) != idem.CodeKeyInProgress || w.Header().Get("Retry-After") == "" {
				t.Fatalf("fenced original answered %d %q, want 409 %s with Retry-After", w.Code, w.Body, idem.CodeKeyInProgress)
			}
			if evA.count(idempotency.EventFenced) != 1 {
				t.Fatalf("fenced events on A: %d, want 1", evA.count(idempotency.EventFenced))
			}
			if w := do(ha, post("/x", "alice", "k", `{}`)); w.Body.String() != "takeover" || w.Header().Get(idem.HeaderReplayed) != "true" {
				t.Fatalf("the original client's retry: %d %q, want B's stored answer", w.Code, w.Body)
			}
		})
	}
}

// switchStore fails renewals while failing is set.
type switchStore struct {
	idempotency.Store
	failing atomic.Bool
}

func (s *switchStore) Renew(ctx context.Context, k idempotency.KeyHash, fence int64, lease time.Duration) error {
	if s.failing.Load() {
		return errPartitioned
	}
	return s.Store.Renew(ctx, k, fence, lease)
}
