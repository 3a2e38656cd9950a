package paysim_test

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/paysim"
	"github.com/idemkit/idem/paysim/paysimtest"
)

type wrapKey struct{}

// Config.Wrap sees every request before the middleware, and the ctx it
// sets reaches Config.Hook's EventBegin; the Hook gets the middleware's
// events after the simulator counted them (Stats still counts the
// replay), through Serve as paysimtest.Start runs it.
func TestHookAndWrap(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		kinds  []idempotency.EventKind
		marked []any
		paths  []string
	)
	cfg := &paysim.Config{
		Hook: func(ctx context.Context, e idempotency.Event) context.Context {
			mu.Lock()
			defer mu.Unlock()
			kinds = append(kinds, e.Kind)
			if e.Kind == idempotency.EventBegin {
				marked = append(marked, ctx.Value(wrapKey{}))
			}
			return ctx
		},
		Wrap: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				paths = append(paths, r.URL.Path)
				mu.Unlock()
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), wrapKey{}, r.Header.Get("X-Trace"))))
			})
		},
	}
	sim, url := paysimtest.Start(t, cfg)
	hc := httpClient(t, nil)
	for range 2 {
		r, err := send(t, hc, "POST", url+"/charges", chargeBody("o-1", "c-1", 100), map[string]string{"Idempotency-Key": "k-1", "X-Trace": "t-1"})
		if err != nil || r.status != http.StatusCreated {
			t.Fatalf("charge: %v %+v", err, r)
		}
	}
	if _, err := send(t, hc, "GET", url+"/healthz", "", nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []idempotency.EventKind{idempotency.EventBegin, idempotency.EventClaim, idempotency.EventComplete, idempotency.EventBegin, idempotency.EventReplay}
	if !slices.Equal(kinds, want) {
		t.Fatalf("hook kinds %v, want %v", kinds, want)
	}
	if !slices.Equal(marked, []any{"t-1", "t-1"}) {
		t.Fatalf("EventBegin ctx values %v: Wrap's ctx did not reach the hook", marked)
	}
	if !slices.Equal(paths, []string{"/charges", "/charges", "/healthz"}) {
		t.Fatalf("Wrap saw %v", paths)
	}
	if st := sim.Stats(); st.Charged != 1 || st.Replayed != 1 {
		t.Fatalf("stats %+v", st)
	}
}
