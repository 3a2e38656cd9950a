package idempotency_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// countingStore counts the claims that reach a real store.
type countingStore struct {
	idempotency.Store
	claims atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, c idempotency.Claim) (idempotency.ClaimResult, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, c)
}

// TestReplayCache: replays of a completed key are served from the process
// cache after the first, mismatches too; the cache never outlives the
// record's retention; a negative size disables it.
func TestReplayCache(t *testing.T) {
	t.Parallel()
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			inner, _ := sc.new(t)
			s := &countingStore{Store: inner}
			var runs atomic.Int64
			h := newMW(t, s, idempotency.Config{}).Wrap(created(&runs))
			w1 := do(h, post("/x", "alice", "k", `{}`))
			for range 3 {
				if w := do(h, post("/x", "alice", "k", `{}`)); w.Body.String() != w1.Body.String() || w.Header().Get(idem.HeaderReplayed) != "true" {
					t.Fatalf("replay %d %q", w.Code, w.Body)
				}
			}
			if w := do(h, post("/x", "alice", "k", `{"other":1}`)); problemCode(t, w) != idem.CodeKeyReused {
				t.Fatalf("mismatch from cache: %d %s", w.Code, w.Body)
			}
			if n := s.claims.Load(); n != 2 || runs.Load() != 1 {
				t.Fatalf("store claims %d, runs %d; want 2 (first run, first replay) and 1", n, runs.Load())
			}

			// Short retention: once the record expires the cached entry is
			// gone too, and the key runs again.
			hs := newMW(t, s, idempotency.Config{Lease: 20 * time.Millisecond, Retention: 20 * time.Millisecond}).Wrap(created(&runs))
			do(hs, post("/y", "alice", "k", `{}`))
			do(hs, post("/y", "alice", "k", `{}`))
			eventually(t, "expiry", func() bool {
				return do(hs, post("/y", "alice", "k", `{}`)).Header().Get(idem.HeaderReplayed) == ""
			})

			off := &countingStore{Store: inner}
			ho := newMW(t, off, idempotency.Config{ReplayCacheBytes: -1}).Wrap(created(&runs))
			for range 3 {
				do(ho, post("/z", "alice", "k", `{}`))
			}
			if off.claims.Load() != 3 {
				t.Fatalf("cache disabled: store claims %d, want 3", off.claims.Load())
			}
		})
	}
}
