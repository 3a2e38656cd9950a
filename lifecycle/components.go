package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/idemkit/idem/internal/startstop"
)

// HTTPServer is a Component serving an *http.Server. Stop stops
// accepting, lets the requests already received reach their handlers (see
// DrainAcceptedTimeout), then calls http.Server.Shutdown (in-flight
// requests finish); HardStop is http.Server.Close (open connections are
// cut).
type HTTPServer struct {
	srv     *http.Server
	tracker *connTracker

	mu      sync.Mutex
	ln      net.Listener
	dl      *drainListener
	started bool
	failed  chan error
}

// NewHTTPServer returns a Component for srv. ln is the listener to serve on;
// nil means listen on srv.Addr at Start. It chains its own hooks into srv's
// ConnContext, ConnState and Handler: set those before calling it.
func NewHTTPServer(srv *http.Server, ln net.Listener) *HTTPServer {
	t := newConnTracker()
	t.install(srv)
	return &HTTPServer{srv: srv, tracker: t, ln: ln, failed: make(chan error, 1)}
}

// Start listens (unless a listener was given) and serves in a goroutine.
// ctx bounds the listen.
func (s *HTTPServer) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return nil
	}
	if s.ln == nil {
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.srv.Addr)
		if err != nil {
			return fmt.Errorf("lifecycle: listen %s: %w", s.srv.Addr, err)
		}
		s.ln = ln
	}
	s.started = true
	s.dl = newDrainListener(s.ln)
	ln := s.dl
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.failed <- fmt.Errorf("lifecycle: http serve: %w", err)
		}
	}()
	return nil
}

// Addr is the bound address once started (or the given listener's), nil
// before.
func (s *HTTPServer) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Stop stops accepting, waits (at most DrainAcceptedTimeout) for the
// requests already received to reach their handlers, then shuts the server
// down, waiting for in-flight requests until ctx ends.
func (s *HTTPServer) Stop(ctx context.Context) error {
	s.mu.Lock()
	started, dl := s.started, s.dl
	s.mu.Unlock()
	if !started {
		return nil
	}
	dl.stopAccepting()
	wctx, cancel := context.WithTimeout(ctx, DrainAcceptedTimeout)
	s.tracker.waitReceived(wctx)
	cancel()
	return s.srv.Shutdown(ctx)
}

// HardStop closes every connection, answered or not.
func (s *HTTPServer) HardStop(context.Context) error {
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if !started {
		return nil
	}
	return s.srv.Close()
}

// Failed delivers the error of a Serve that ended on its own.
func (s *HTTPServer) Failed() <-chan error { return s.failed }

// Task is a Component running one function in a goroutine between Start and
// Stop, such as a polling loop or a consumer. It has the start/stop
// contract of every long-running component of idem (internal/startstop):
// Start on a running Task is a no-op, Start after a stop runs the function
// afresh, and Stop and HardStop are safe before Start, twice and
// concurrently.
//
// The function's ctx has Start's values and ends at the soft stop: the loop
// must take no new work once it is done. Work already in hand runs on
// WorkContext(ctx), which survives the soft stop and ends only at the hard
// stop: a batch context cut loose from the loop's cancellation, with the
// hard stop still honoured.
type Task struct {
	name string
	run  func(ctx context.Context) error
	svc  startstop.Service
}

// Go returns a Task running fn. name appears in errors.
func Go(name string, fn func(ctx context.Context) error) *Task {
	return &Task{name: name, run: fn}
}

// Start launches the function in a goroutine and returns. ctx lends its
// values to the function's contexts; cancelling it after Start returned
// changes nothing.
func (t *Task) Start(ctx context.Context) error {
	return t.svc.Start(ctx, func(ctx context.Context, g *startstop.Group) error {
		g.Go(ctx, func(ctx context.Context) {
			err := t.run(ctx)
			if ctx.Err() == nil {
				// Returned before it was stopped: the Task failed, whatever
				// it returned. Failed delivers this, and Stop returns it.
				if err == nil {
					err = errors.New("ended before it was stopped")
				}
				g.Fail(fmt.Errorf("lifecycle: task %s: %w", t.name, err))
				return
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				g.Fail(fmt.Errorf("lifecycle: task %s: %w", t.name, err))
			}
		})
		return nil
	})
}

// Stop ends the function's ctx and waits for it to return until ctx ends.
// It returns the function's error (nil for context.Canceled), or ctx.Err()
// on timeout.
func (t *Task) Stop(ctx context.Context) error { return t.svc.Stop(ctx) }

// HardStop also ends WorkContext, abandoning the work in hand, and waits
// for the function until ctx ends.
func (t *Task) HardStop(ctx context.Context) error { return t.svc.HardStop(ctx) }

// Failed delivers the function's error when it returned before Stop.
func (t *Task) Failed() <-chan error { return t.svc.Failed() }

// WorkContext returns a context for work in hand: it has ctx's values, is
// not cancelled by the soft stop of the component that gave ctx (a Task, or
// any of idem's long-running components), and is cancelled by that
// component's hard stop. Bound it with your own timeout
// (context.WithTimeout) so that a stuck dependency cannot hold the stop.
// For a ctx that does not come from such a component it is
// context.WithoutCancel(ctx), cancelled by the returned func.
//
// It is the one work context of the codebase: the outbox relay, the Kafka
// consumer and the purgers use the same one for their batches.
func WorkContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return startstop.WorkContext(ctx)
}

// Funcs adapts plain functions to a Component and HardStopper. A nil
// function does nothing. Each function runs at most once; Stop and HardStop
// before Start do nothing.
type Funcs struct {
	StartFunc    func(ctx context.Context) error
	StopFunc     func(ctx context.Context) error
	HardStopFunc func(ctx context.Context) error

	mu                      sync.Mutex
	started, stopped, hards bool
}

// Start calls StartFunc once.
func (f *Funcs) Start(ctx context.Context) error {
	f.mu.Lock()
	if f.started {
		f.mu.Unlock()
		return nil
	}
	f.started = true
	f.mu.Unlock()
	if f.StartFunc == nil {
		return nil
	}
	return f.StartFunc(ctx)
}

// Stop calls StopFunc once, after Start.
func (f *Funcs) Stop(ctx context.Context) error {
	f.mu.Lock()
	if !f.started || f.stopped {
		f.mu.Unlock()
		return nil
	}
	f.stopped = true
	f.mu.Unlock()
	if f.StopFunc == nil {
		return nil
	}
	return f.StopFunc(ctx)
}

// HardStop calls HardStopFunc once, after Start.
func (f *Funcs) HardStop(ctx context.Context) error {
	f.mu.Lock()
	if !f.started || f.hards {
		f.mu.Unlock()
		return nil
	}
	f.hards = true
	f.mu.Unlock()
	if f.HardStopFunc == nil {
		return nil
	}
	return f.HardStopFunc(ctx)
}

// Closer returns a Component whose Stop calls fn once (a pool, a Kafka
// client): Start does nothing, because the resource exists already. A close
// that blocks past the stage's budget is abandoned.
func Closer(fn func()) Component {
	return &Funcs{StopFunc: func(ctx context.Context) error {
		done := make(chan struct{})
		go func() { fn(); close(done) }()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
}
