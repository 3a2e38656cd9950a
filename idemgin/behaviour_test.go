package idemgin_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// TestRouteTemplateScope: the route scope is gin's template, so one key on
// /orders/1 and then /orders/2 is the same operation sent twice with a
// different request (reused), while the same key on /charges is another
// operation. With the URL path as the route, /orders/2 would run.
func TestRouteTemplateScope(t *testing.T) {
	t.Parallel()
	a := setup(t, idempotency.ModeTwoStep, false, nil)
	if r := a.post(t, "/orders/1", "k-route", `{}`); r.status != http.StatusCreated {
		t.Fatalf("/orders/1: %+v", r)
	}
	if r := a.post(t, "/orders/2", "k-route", `{}`); r.status != http.StatusConflict || !strings.Contains(r.body, idem.CodeKeyReused) {
		t.Fatalf("/orders/2 with the key of /orders/1: %+v, want 409 %s", r, idem.CodeKeyReused)
	}
	if r := a.post(t, "/charges", "k-route", `{}`); r.status != http.StatusCreated || r.replayed {
		t.Fatalf("/charges with the key of /orders/1: %+v, want its own 201", r)
	}
	if n := a.rows(t); n != 2 {
		t.Fatalf("%d executions, want 2", n)
	}
}

// TestReleaseAndRollback: a panic (with gin.Recovery before or after
// idemgin), a 5xx and DoNotStore release the key; in transactional mode the
// handler's write rolls back with it, so nothing of the failed run is
// stored. The retry runs the handler again and is then replayed.
func TestReleaseAndRollback(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		for _, inside := range []bool{false, true} {
			for _, fault := range []string{"X-Panic", "X-Fail-After-Write", "X-No-Store"} {
				t.Run(fmt.Sprintf("%s/recovery-inside=%v/%s", mode, inside, fault), func(t *testing.T) {
					t.Parallel()
					a := setup(t, mode, inside, nil)
					first := a.post(t, "/charges", "k-release", `{"n":1}`, fault, "1")
					want := http.StatusInternalServerError
					switch fault {
					case "X-Fail-After-Write":
						want = http.StatusServiceUnavailable
					case "X-No-Store":
						want = http.StatusCreated
					}
					if first.status != want || first.replayed {
						t.Fatalf("first: %+v, want %d", first, want)
					}
					// Two-step commits the write on its own; transactional
					// rolls it back with the claim, DoNotStore included.
					wantRows := 1
					if mode == idempotency.ModeTransactional {
						wantRows = 0
					}
					if n := a.rows(t); n != wantRows {
						t.Fatalf("%d rows after the failed run, want %d", n, wantRows)
					}
					retry := a.post(t, "/charges", "k-release", `{"n":1}`)
					if retry.status != http.StatusCreated || retry.replayed {
						t.Fatalf("retry: %+v, want a fresh 201", retry)
					}
					if n := a.rows(t); n != wantRows+1 {
						t.Fatalf("%d rows after the retry, want %d", n, wantRows+1)
					}
					again := a.post(t, "/charges", "k-release", `{"n":1}`)
					if again.status != http.StatusCreated || !again.replayed || again.body != retry.body {
						t.Fatalf("second retry: %+v, want the replay of %q", again, retry.body)
					}
				})
			}
		}
	}
}

// TestWait: with Config.Wait a duplicate waits for the first request and
// gets its response replayed instead of 409.
func TestWait(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			claims := make(chan idempotency.Outcome, 16)
			a := setup(t, mode, false, &idempotency.Config{Wait: 20 * time.Second}, func(s *idempotency.PostgresStore) idempotency.Store {
				return &watchedStore{PostgresStore: s, outcomes: claims}
			})
			release := a.gate.Hold()
			defer release()
			first := make(chan reply, 1)
			go func() { first <- a.post(t, "/charges", "k-wait", `{"n":1}`) }()
			if o := <-claims; o != idempotency.OutcomeClaimed {
				t.Fatalf("the first claim: %s", o)
			}
			second := make(chan reply, 1)
			go func() { second <- a.post(t, "/charges", "k-wait", `{"n":1}`) }()
			// The duplicate met the held claim: without Wait it would
			// answer 409 now; with it, it polls until the first completes.
			if o := <-claims; o != idempotency.OutcomeInProgress {
				t.Fatalf("the duplicate's claim: %s", o)
			}
			release()
			f, s := <-first, <-second
			if f.status != http.StatusCreated || s.status != http.StatusCreated || !s.replayed || s.body != f.body {
				t.Fatalf("first %+v, duplicate %+v: want the duplicate to replay the first", f, s)
			}
			if n := a.rows(t); n != 1 {
				t.Fatalf("%d executions, want 1", n)
			}
		})
	}
}

// watchedStore is the PostgreSQL store reporting each claim's outcome.
type watchedStore struct {
	*idempotency.PostgresStore
	outcomes chan idempotency.Outcome
}

func (s *watchedStore) Claim(ctx context.Context, c idempotency.Claim) (idempotency.ClaimResult, error) {
	res, err := s.PostgresStore.Claim(ctx, c)
	if err == nil {
		s.note(res.Outcome)
	}
	return res, err
}

func (s *watchedStore) BeginClaim(ctx context.Context, c idempotency.Claim) (*idempotency.ClaimTx, idempotency.ClaimResult, error) {
	tx, res, err := s.PostgresStore.BeginClaim(ctx, c)
	if err == nil {
		s.note(res.Outcome)
	}
	return tx, res, err
}

// note keeps the first outcomes; later ones (the duplicate's polls) are
// dropped rather than block the store.
func (s *watchedStore) note(o idempotency.Outcome) {
	select {
	case s.outcomes <- o:
	default:
	}
}
