package idempotency_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/idemkit/idem/idempotency"
)

// TestPrincipalFromContext: in every mode the handler reads the principal
// that Config.Scope computed for its request, the one its key is scoped
// by; outside the middleware there is none.
func TestPrincipalFromContext(t *testing.T) {
	t.Parallel()
	if p, ok := idempotency.PrincipalFromContext(context.Background()); ok || p != "" {
		t.Fatalf("outside the middleware: %q, %v; want none", p, ok)
	}
	for _, mc := range modeCases {
		t.Run(mc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := mc.store.new(t)
			got := make(chan string, 2)
			h := newMW(t, s, idempotency.Config{Mode: mc.mode, Scope: func(r *http.Request) (string, error) {
				return "principal-" + r.Header.Get("X-User"), nil
			}}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				p, ok := idempotency.PrincipalFromContext(r.Context())
				if !ok {
					p = "<none>"
				}
				got <- p
				w.WriteHeader(http.StatusCreated)
			}))
			for _, user := range []string{"alice", "bob"} {
				if w := do(h, post("/orders", user, "k1", `{"total":1}`)); w.Code != http.StatusCreated {
					t.Fatalf("%s: %d, want 201", user, w.Code)
				}
				if p := <-got; p != "principal-"+user {
					t.Fatalf("handler of %s's request read principal %q", user, p)
				}
			}
		})
	}
}
