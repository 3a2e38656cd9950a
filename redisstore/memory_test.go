package redisstore_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/redisstore"
)

// TestMemoryFull: with maxmemory-policy noeviction a full server refuses
// writes: first large completions (the handler has run; its claim stands
// until its lease runs out), then claims (the middleware answers 503 and
// the handler does not run); nothing stored is lost; with an evicting policy the same pressure
// deletes stored completions, whose keys are then new again (the loss the
// package doc warns about, and CheckServer names).
func TestMemoryFull(t *testing.T) {
	t.Parallel()
	srv := startOwnServer(t, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	c := newClient(t, srv.addr())
	s, err := redisstore.New(c, &redisstore.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	body := bytes.Repeat([]byte("x"), 64<<10)
	var (
		stored  []idempotency.KeyHash
		refused int // completions refused: their claims stand
		full    error
	)
	for range 100000 {
		k := key(t)
		res, err := s.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour))
		if err != nil {
			full = err
			break
		}
		if err := s.Complete(ctx, k, res.Fence, &idempotency.Response{Status: 201, Body: body}, time.Hour); err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatal(err)
			}
			// A large completion is refused before a small claim is: the
			// handler has run, and its claim stands until its lease runs
			// out (the retry then runs it again, as after any failed
			// completion).
			refused++
			continue
		}
		stored = append(stored, k)
	}
	if full == nil || !strings.Contains(full.Error(), "OOM") || len(stored) == 0 {
		t.Fatalf("filling a 4 MB server with 64 KB responses: %d stored, %d refused, then %v; want an OOM error", len(stored), refused, full)
	}
	// The handler does not run unprotected: 503.
	runs := 0
	mw, err := idempotency.New(s, &idempotency.Config{Scope: func(*http.Request) (string, error) { return "alice", nil }})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs++; w.WriteHeader(201) }))
	for _, k := range []string{"k1", "k2"} {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", k)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusServiceUnavailable || runs != 0 {
			t.Fatalf("a claim on a full server: %d (handler ran %d times), want 503 and no run", w.Code, runs)
		}
	}
	for _, k := range stored {
		mustClaim(t, s, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeCompleted)
	}

	// The same server, evicting: room is made by deleting records.
	if err := c.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if ws, err := s.CheckServer(ctx); err != nil || settings(ws)["maxmemory-policy"] != "volatile-lru" {
		t.Fatalf("CheckServer on volatile-lru: %v, %v", ws, err)
	}
	for range 2 * len(stored) {
		k := key(t)
		res, err := s.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour))
		if err != nil {
			t.Fatalf("claim on an evicting server: %v", err)
		}
		if err := s.Complete(ctx, k, res.Fence, &idempotency.Response{Status: 201, Body: body}, time.Hour); err != nil {
			t.Fatalf("complete on an evicting server: %v", err)
		}
	}
	lost := 0
	for _, k := range stored {
		res, err := s.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome == idempotency.OutcomeClaimed {
			lost++
		}
	}
	if lost == 0 {
		t.Fatalf("an evicting server kept all %d completions under twice their size of new ones", len(stored))
	}
	t.Logf("noeviction: %d completions kept, %d refused, then claims refused with %v; volatile-lru: %d of them evicted", len(stored), refused, full, lost)
}
