package idempotency_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// TestDoNotStoreReleasesTheKey: a handler that refuses a request before
// acting and says so with DoNotStore (through a wrapping ResponseWriter,
// as a metrics layer would add) gets its 4xx delivered but not stored, in
// every mode: the same request then runs the handler again. In
// transactional mode nothing is left in the store, so the key may even be
// reused with a corrected body.
func TestDoNotStoreReleasesTheKey(t *testing.T) {
	t.Parallel()
	for _, mc := range modeCases {
		t.Run(mc.name, func(t *testing.T) {
			t.Parallel()
			s, pool := mc.store.new(t)
			var runs atomic.Int64
			ev := &events{}
			h := newMW(t, s, idempotency.Config{Mode: mc.mode, Hook: ev.hook}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				if r.Header.Get("X-Invalid") != "" {
					if !idempotency.DoNotStore(wrapped{w}) {
						t.Error("DoNotStore did not find the middleware's writer")
					}
					w.WriteHeader(http.StatusBadRequest)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			bad := func() *http.Request {
				r := post("/orders", "alice", "k1", `{"total":"x"}`)
				r.Header.Set("X-Invalid", "1")
				return r
			}
			for i := range 2 {
				if w := do(h, bad()); w.Code != http.StatusBadRequest || w.Header().Get(idem.HeaderReplayed) != "" {
					t.Fatalf("invalid request %d: %d %v, want a fresh 400", i, w.Code, w.Header())
				}
			}
			if runs.Load() != 2 || ev.count(idempotency.EventRelease) != 2 || ev.count(idempotency.EventComplete) != 0 {
				t.Fatalf("%d runs, %d releases, %d completes; want 2, 2, 0", runs.Load(), ev.count(idempotency.EventRelease), ev.count(idempotency.EventComplete))
			}
			if mc.mode != idempotency.ModeTransactional {
				// A two-step claim was committed before the handler ran:
				// released, it keeps its fingerprint, so another body under
				// the key is still a reuse.
				if w := do(h, post("/orders", "alice", "k1", `{"total":1}`)); w.Code != http.StatusConflict {
					t.Fatalf("other body after a released two-step claim: %d, want 409", w.Code)
				}
				return
			}
			// In transactional mode nothing of the refused request remains:
			// the corrected request, same key, other body, runs and is stored.
			var n int
			if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_key`).Scan(&n); err != nil || n != 0 {
				t.Fatalf("%d records (%v) after DoNotStore answers, want 0", n, err)
			}
			if w := do(h, post("/orders", "alice", "k1", `{"total":1}`)); w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "" {
				t.Fatalf("corrected request: %d %v, want a fresh 201", w.Code, w.Header())
			}
			if w := do(h, post("/orders", "alice", "k1", `{"total":1}`)); w.Code != http.StatusCreated || w.Header().Get(idem.HeaderReplayed) != "true" {
				t.Fatalf("retry: %d %v, want the replay", w.Code, w.Header())
			}
		})
	}
	// Outside the middleware it is a no-op that says so.
	if idempotency.DoNotStore(wrapped{nil}) {
		t.Error("DoNotStore found a recorder where there is none")
	}
}

// wrapped is a ResponseWriter wrapper with Unwrap, like a metrics layer's.
type wrapped struct{ http.ResponseWriter }

func (w wrapped) Unwrap() http.ResponseWriter { return w.ResponseWriter }
