package idemconnect_test

import (
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemconnect"
)

// TestClientInterceptor: the caller's retries with WithKey carry one key,
// so three attempts (two answered Unavailable) are one operation and a
// fourth gets the replay; calls without WithKey get a fresh key each; an
// invalid key fails the call unsent.
func TestClientInterceptor(t *testing.T) {
	t.Parallel()
	b := setup(t, &idemconnect.Config{})
	c := b.client(procCharge, false, connect.WithInterceptors(idemconnect.ClientInterceptor(nil)))
	b.svc.failNext.Store(2)
	ctx := idemconnect.WithKey(t.Context(), "order-7:charge")
	var last answer
	for attempt := range 4 {
		last = call(ctx, c, "", map[string]any{"amount": 5.0})
		if attempt < 2 && connect.CodeOf(last.err) != connect.CodeUnavailable {
			t.Errorf("attempt %d: %s, want Unavailable", attempt, last)
		}
	}
	if last.err != nil || !last.replayed {
		t.Errorf("fourth attempt: %s, want the replay", last)
	}
	n, ok := b.svc.keys.Load("order-7:charge")
	if !ok || n.(interface{ Load() int64 }).Load() != 3 {
		t.Errorf("executions under the caller's key: %v, want 3", n)
	}
	for range 2 {
		if a := call(t.Context(), c, "", map[string]any{"amount": 6.0}); a.err != nil || a.replayed {
			t.Errorf("a call without a key: %s, want a fresh run", a)
		}
	}
	keys := 0
	b.svc.keys.Range(func(any, any) bool { keys++; return true })
	if keys != 3 {
		t.Errorf("%d distinct keys seen, want 3 (the caller's and two fresh)", keys)
	}
	before := b.svc.calls.Load()
	a := call(idemconnect.WithKey(t.Context(), "a b"), c, "", map[string]any{"amount": 7.0})
	if !errors.Is(a.err, idemconnect.ErrKeyInvalid) || !errors.Is(a.err, idem.ErrKeyInvalid) {
		t.Errorf("invalid key: %v, want ErrKeyInvalid", a.err)
	}
	if b.svc.calls.Load() != before {
		t.Error("the call with an invalid key reached the server")
	}
}
