package lifecycle

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// Why the HTTP stop drains before http.Server.Shutdown, step by step.
//
// Shutdown closes the listener and then waits for active connections. But
// net/http drops, without an answer, a request whose headers it finishes
// reading after Shutdown began (server.go: "if c.server.shuttingDown()
// { return }" right after readRequest). So a connection accepted a moment
// before the listener closed, whose request is still on its way in, is
// closed under the client: the client sees EOF for a request the server
// never ran. To answer those too, Stop:
//
//  1. stops accepting: the real listener is closed, but Serve's Accept
//     blocks (instead of failing) until Shutdown closes the wrapper;
//  2. waits, at most DrainAcceptedTimeout (and never past the stop's ctx),
//     until no connection is new or reading a request that has not reached
//     the handler yet;
//  3. calls Shutdown, which now only waits for handlers already running.
//
// Connections still in the kernel's accept backlog when the listener closes
// are reset by the kernel; nothing in the process can answer them. That is
// what the drain delay before the first stage (readiness off while still
// serving) is for: load balancers stop sending new connections first.

// DrainAcceptedTimeout bounds step 2 of the HTTP stop.
const DrainAcceptedTimeout = time.Second

// drainListener lets Stop close the real listener without Serve returning
// an error.
type drainListener struct {
	net.Listener
	stopOnce, closeOnce sync.Once
	stopped, closed     chan struct{}
}

func newDrainListener(ln net.Listener) *drainListener {
	return &drainListener{Listener: ln, stopped: make(chan struct{}), closed: make(chan struct{})}
}

func (l *drainListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		select {
		case <-l.stopped:
			// Stopped accepting on purpose: park Serve until Shutdown
			// closes the wrapper, then report a closed listener, which
			// Serve turns into ErrServerClosed.
			<-l.closed
			return nil, net.ErrClosed
		default:
		}
	}
	return c, err
}

func (l *drainListener) stopAccepting() {
	l.stopOnce.Do(func() {
		close(l.stopped)
		_ = l.Listener.Close()
	})
}

func (l *drainListener) Close() error {
	l.stopAccepting()
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

// connTracker knows, per connection, whether a request is being read but
// has not reached the handler yet.
type connTracker struct {
	mu      sync.Mutex
	conns   map[net.Conn]*connInfo
	changed chan struct{} // closed and replaced on every change
}

type connInfo struct {
	state     http.ConnState
	inHandler int
}

type connKey struct{}

func newConnTracker() *connTracker {
	return &connTracker{conns: map[net.Conn]*connInfo{}, changed: make(chan struct{})}
}

func (t *connTracker) notifyLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// install chains the tracker into srv's ConnContext, ConnState and Handler.
func (t *connTracker) install(srv *http.Server) {
	prevCtx, prevState, next := srv.ConnContext, srv.ConnState, srv.Handler
	if next == nil {
		next = http.DefaultServeMux
	}
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if prevCtx != nil {
			ctx = prevCtx(ctx, c)
		}
		t.mu.Lock()
		info := &connInfo{state: http.StateNew}
		t.conns[c] = info
		t.notifyLocked()
		t.mu.Unlock()
		return context.WithValue(ctx, connKey{}, c)
	}
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		t.mu.Lock()
		switch st {
		case http.StateClosed, http.StateHijacked:
			delete(t.conns, c)
		default:
			if info := t.conns[c]; info != nil {
				info.state = st
			}
		}
		t.notifyLocked()
		t.mu.Unlock()
		if prevState != nil {
			prevState(c, st)
		}
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(net.Conn)
		t.mu.Lock()
		if info := t.conns[c]; info != nil {
			info.inHandler++
		}
		t.notifyLocked()
		t.mu.Unlock()
		defer func() {
			t.mu.Lock()
			if info := t.conns[c]; info != nil {
				info.inHandler--
			}
			t.notifyLocked()
			t.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

// waitReceived waits until no connection is new or reading a request that
// has not reached the handler, or until ctx ends.
func (t *connTracker) waitReceived(ctx context.Context) {
	for {
		t.mu.Lock()
		pending := false
		for _, info := range t.conns {
			if info.state == http.StateNew || (info.state == http.StateActive && info.inHandler == 0) {
				pending = true
				break
			}
		}
		changed := t.changed
		t.mu.Unlock()
		if !pending {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}
