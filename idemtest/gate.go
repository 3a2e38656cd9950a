package idemtest

import (
	"context"
	"net/http"
	"sync"
)

// Gate holds a handler's executions on demand, so that the retry-after
// check observes the in-progress answer for sure instead of racing for it.
// Wrap the application handler, inside the idempotency middleware, and pass
// Hold as Target.Hold:
//
//	var gate idemtest.Gate
//	h := idempotency.Middleware(...)(gate.Wrap(app))
//	idemtest.Check(t, idemtest.Target{Handler: h, Hold: gate.Hold, ...})
//
// The zero Gate is open.
type Gate struct {
	mu   sync.Mutex
	held chan struct{} // nil while open; closed by release
}

// Wrap returns h behind the gate: while the gate is held, a request waits
// before h until release (or until the request's context ends, in which
// case h is not called and the request gets 503).
func (g *Gate) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !g.Wait(req.Context()) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, req)
	})
}

// Wait is the gate for a handler that is not an http.Handler (a Fiber
// handler, say): it returns at once while the gate is open, else when it
// is released (true) or ctx ends (false: do not run the handler).
func (g *Gate) Wait(ctx context.Context) bool {
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	if held == nil {
		return true
	}
	select {
	case <-held:
		return true
	case <-ctx.Done():
		return false
	}
}

// Hold makes requests that reach the gate wait until release is called.
// release is safe to call more than once.
func (g *Gate) Hold() (release func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.held = ch
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			if g.held == ch {
				g.held = nil
			}
			g.mu.Unlock()
			close(ch)
		})
	}
}
