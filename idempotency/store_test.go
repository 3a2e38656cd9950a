package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
)

func fp(s string) idempotency.Fingerprint {
	return idempotency.Fingerprint(idempotency.HashKey("fp", "", "", s))
}

func claimOf(key, body string, lease, retention time.Duration) idempotency.Claim {
	return idempotency.Claim{Key: idempotency.HashKey("alice", "POST", "/x", key), Fingerprint: fp(body), Lease: lease, Retention: retention}
}

// TestStore runs one table of cases against every Store implementation.
func TestStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const long = time.Hour
	resp := &idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/x/1"}}, Body: []byte(`{"id":1}`)}

	testCases := []struct {
		name string
		run  func(t *testing.T, s idempotency.Store)
	}{
		{"claim then in progress", func(t *testing.T, s idempotency.Store) {
			c := claimOf("k", "a", long, 24*time.Hour)
			r1, err := s.Claim(ctx, c)
			if err != nil || r1.Outcome != idempotency.OutcomeClaimed || r1.Fence <= 0 {
				t.Fatalf("first claim = %+v, %v", r1, err)
			}
			r2, err := s.Claim(ctx, c)
			if err != nil || r2.Outcome != idempotency.OutcomeInProgress {
				t.Fatalf("second claim = %+v, %v; want in progress", r2, err)
			}
			if r2.RetryAfter <= 0 || r2.RetryAfter > long {
				t.Fatalf("RetryAfter = %v, want within the lease", r2.RetryAfter)
			}
		}},
		{"mismatch wins over in progress", func(t *testing.T, s idempotency.Store) {
			if r, err := s.Claim(ctx, claimOf("k", "a", long, long)); err != nil || r.Outcome != idempotency.OutcomeClaimed {
				t.Fatalf("claim = %+v, %v", r, err)
			}
			r, err := s.Claim(ctx, claimOf("k", "b", long, long))
			if err != nil || r.Outcome != idempotency.OutcomeMismatch {
				t.Fatalf("claim with other fingerprint = %+v, %v; want mismatch", r, err)
			}
		}},
		{"complete then replay", func(t *testing.T, s idempotency.Store) {
			c := claimOf("k", "a", long, long)
			r, err := s.Claim(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, c.Key, r.Fence, resp, long); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			r2, err := s.Claim(ctx, c)
			if err != nil || r2.Outcome != idempotency.OutcomeCompleted {
				t.Fatalf("claim after complete = %+v, %v", r2, err)
			}
			got := r2.Response
			if got.Status != 201 || string(got.Body) != `{"id":1}` || got.Header.Get("Location") != "/x/1" || got.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("replayed %+v", got)
			}
			if r3, _ := s.Claim(ctx, claimOf("k", "b", long, long)); r3.Outcome != idempotency.OutcomeMismatch {
				t.Fatalf("other fingerprint after complete = %v, want mismatch", r3.Outcome)
			}
			if err := s.Complete(ctx, c.Key, r.Fence, resp, long); !errors.Is(err, idempotency.ErrFenced) {
				t.Fatalf("second Complete = %v, want ErrFenced", err)
			}
		}},
		{"release then claim again with a newer fence", func(t *testing.T, s idempotency.Store) {
			c := claimOf("k", "a", long, long)
			r1, _ := s.Claim(ctx, c)
			if err := s.Release(ctx, c.Key, r1.Fence); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if r, _ := s.Claim(ctx, claimOf("k", "b", long, long)); r.Outcome != idempotency.OutcomeMismatch {
				t.Fatalf("released key, other fingerprint = %v, want mismatch", r.Outcome)
			}
			r2, err := s.Claim(ctx, c)
			if err != nil || r2.Outcome != idempotency.OutcomeClaimed || r2.Fence <= r1.Fence {
				t.Fatalf("claim after release = %+v, %v (old fence %d)", r2, err, r1.Fence)
			}
			if err := s.Complete(ctx, c.Key, r1.Fence, resp, long); !errors.Is(err, idempotency.ErrFenced) {
				t.Fatalf("Complete with released fence = %v, want ErrFenced", err)
			}
			if err := s.Release(ctx, c.Key, r1.Fence); !errors.Is(err, idempotency.ErrFenced) {
				t.Fatalf("Release with old fence = %v, want ErrFenced", err)
			}
		}},
		{"lease end: one takeover, late original fenced out", func(t *testing.T, s idempotency.Store) {
			short := claimOf("k", "a", 50*time.Millisecond, long)
			r1, _ := s.Claim(ctx, short)
			if r, _ := s.Claim(ctx, claimOf("k", "b", long, long)); r.Outcome != idempotency.OutcomeMismatch {
				t.Fatalf("other fingerprint during lease = %v, want mismatch", r.Outcome)
			}
			var r2 idempotency.ClaimResult
			eventually(t, "takeover", func() bool {
				var err error
				r2, err = s.Claim(ctx, claimOf("k", "a", long, long))
				if err != nil {
					t.Fatal(err)
				}
				return r2.Outcome != idempotency.OutcomeInProgress
			})
			if r2.Outcome != idempotency.OutcomeTookOver || r2.Fence <= r1.Fence {
				t.Fatalf("after lease = %+v, want took over with a newer fence than %d", r2, r1.Fence)
			}
			if r, _ := s.Claim(ctx, claimOf("k", "a", long, long)); r.Outcome != idempotency.OutcomeInProgress {
				t.Fatalf("after takeover = %v, want in progress (one takeover only)", r.Outcome)
			}
			if err := s.Complete(ctx, short.Key, r1.Fence, resp, long); !errors.Is(err, idempotency.ErrFenced) {
				t.Fatalf("late original Complete = %v, want ErrFenced", err)
			}
			if err := s.Complete(ctx, short.Key, r2.Fence, resp, long); err != nil {
				t.Fatalf("new owner Complete: %v", err)
			}
		}},
		{"expired key is reusable with any request", func(t *testing.T, s idempotency.Store) {
			c := claimOf("k", "a", time.Millisecond, time.Millisecond)
			r, _ := s.Claim(ctx, c)
			if err := s.Complete(ctx, c.Key, r.Fence, resp, time.Millisecond); err != nil {
				t.Fatal(err)
			}
			var r2 idempotency.ClaimResult
			eventually(t, "expiry", func() bool {
				r2, _ = s.Claim(ctx, claimOf("k", "b", long, long))
				return r2.Outcome != idempotency.OutcomeMismatch
			})
			if r2.Outcome != idempotency.OutcomeClaimed {
				t.Fatalf("expired key = %+v, want claimed", r2)
			}
		}},
		{"purge deletes expired records only", func(t *testing.T, s idempotency.Store) {
			for _, k := range []string{"e1", "e2", "e3"} {
				c := claimOf(k, "a", time.Millisecond, time.Millisecond)
				r, _ := s.Claim(ctx, c)
				if err := s.Complete(ctx, c.Key, r.Fence, resp, time.Millisecond); err != nil {
					t.Fatal(err)
				}
			}
			live := claimOf("live", "a", long, long)
			r, _ := s.Claim(ctx, live)
			if err := s.Complete(ctx, live.Key, r.Fence, resp, long); err != nil {
				t.Fatal(err)
			}
			s.Claim(ctx, claimOf("claimed", "a", long, long))
			total := 0
			eventually(t, "purge", func() bool {
				n, err := s.Purge(ctx, 2)
				if err != nil || n > 2 {
					t.Fatalf("Purge = %d, %v", n, err)
				}
				total += n
				return total == 3
			})
			if n, _ := s.Purge(ctx, 10); n != 0 {
				t.Fatalf("purged %d live records", n)
			}
			if r, _ := s.Claim(ctx, live); r.Outcome != idempotency.OutcomeCompleted {
				t.Fatalf("live record after purge: %v", r.Outcome)
			}
		}},
		{"50 concurrent claims: exactly one wins", func(t *testing.T, s idempotency.Store) {
			c := claimOf("k", "a", long, long)
			var mu sync.Mutex
			counts := map[idempotency.Outcome]int{}
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range 50 {
				wg.Go(func() {
					<-start
					r, err := s.Claim(ctx, c)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					counts[r.Outcome]++
					mu.Unlock()
				})
			}
			close(start)
			wg.Wait()
			if counts[idempotency.OutcomeClaimed] != 1 || counts[idempotency.OutcomeInProgress] != 49 {
				t.Fatalf("outcomes %v, want 1 claimed and 49 in progress", counts)
			}
		}},
		{"cancelled context is an error", func(t *testing.T, s idempotency.Store) {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			if _, err := s.Claim(cctx, claimOf("k", "a", long, long)); err == nil {
				t.Fatal("Claim with a cancelled context succeeded")
			}
		}},
	}
	for _, sc := range storeCases {
		for _, tt := range testCases {
			t.Run(sc.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				s, _ := sc.new(t)
				tt.run(t, s)
			})
		}
	}
}
