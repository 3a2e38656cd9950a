// Package startstop is the one start/stop state machine of idem's
// long-running components (the outbox relay, the Kafka consumer, the
// idempotency and inbox purgers, lifecycle.Task). Each embeds a Service and
// gets the same method set with the same meaning:
//
//   - Start(ctx) launches the component's goroutines and returns. ctx bounds
//     the start only (connecting, listening) and lends its values to every
//     goroutine of the run; cancelling it after Start has returned changes
//     nothing. Start on a running component is a no-op that returns nil.
//     Start after a completed stop starts a fresh run; Start during a stop
//     waits for that stop to end first (or for ctx).
//   - Stop(ctx) is the soft stop: the run's context ends, so no new work is
//     taken; work in hand runs on WorkContext and finishes. Stop returns when
//     every goroutine of the run has returned, or with ctx.Err() when ctx
//     ends first (the goroutines then go on in the background, and a later
//     Stop or HardStop waits for them again).
//   - HardStop(ctx) is the soft stop plus the end of WorkContext: work in
//     hand is abandoned (a transaction rolls back, a call is cancelled).
//     Like Stop, it waits until the goroutines return or ctx ends.
//
// Stop and HardStop are safe to call before Start, twice, and concurrently:
// with nothing running they return nil at once.
package startstop

import (
	"context"
	"errors"
	"sync"
)

// ErrStopped is the cause of a run's contexts once they end: context.Cause
// tells a soft stop (ErrStopped) from a hard stop (ErrHardStopped).
var (
	ErrStopped     = errors.New("startstop: stopped")
	ErrHardStopped = errors.New("startstop: hard stopped")
)

type workKey struct{}

// Service is the embedded state machine. The zero value is ready to use.
// It must not be copied after first use.
type Service struct {
	mu         sync.Mutex
	run        *run
	prev       *run // the last run, while it is stopping
	failedOnce sync.Once
	failed     chan error
}

type run struct {
	soft     context.CancelCauseFunc
	hard     context.CancelCauseFunc
	wg       sync.WaitGroup
	done     chan struct{}
	mu       sync.Mutex
	err      error // first error reported by Fail
	stopping bool
}

// Launch is what a component gives Start: it is called once per run, with
// the run's context (Start's values; cancelled by the soft stop), and must
// start the run's goroutines with Go and return promptly. An error aborts
// the run: its goroutines get a hard stop, are waited for, and Start
// returns the error.
type Launch func(ctx context.Context, g *Group) error

// Group starts the goroutines of one run.
type Group struct {
	s *Service
	r *run
}

// Fail reports that the run cannot go on (a listener died, a loop hit an
// unrecoverable error). The first error of a run is delivered once on
// Failed, unless a stop had begun, and returned by the Stop or HardStop
// that ends the run. Fail does not stop the run: the owner (lifecycle.Group,
// or the caller) decides.
func (g *Group) Fail(err error) {
	if err == nil {
		return
	}
	g.r.mu.Lock()
	first := g.r.err == nil
	if first {
		g.r.err = err
	}
	live := !g.r.stopping
	g.r.mu.Unlock()
	if first && live {
		select {
		case g.s.failedChan() <- err:
		default:
		}
	}
}

// Go runs fn in a goroutine of the run. fn gets the run's context; it must
// return once that context ends (soft stop), finishing work in hand on
// WorkContext.
func (g *Group) Go(ctx context.Context, fn func(ctx context.Context)) {
	g.r.wg.Add(1)
	go func() {
		defer g.r.wg.Done()
		fn(ctx)
	}()
}

// Start starts a run unless one is running; see the package doc.
func (s *Service) Start(ctx context.Context, launch Launch) error {
	for {
		s.mu.Lock()
		if s.run != nil {
			s.mu.Unlock()
			return nil
		}
		if prev := s.prev; prev != nil {
			s.mu.Unlock()
			select {
			case <-prev.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			s.mu.Lock()
			if s.prev == prev {
				s.prev = nil
			}
			s.mu.Unlock()
			continue
		}
		if err := ctx.Err(); err != nil {
			s.mu.Unlock()
			return err
		}
		r := &run{done: make(chan struct{})}
		base := context.WithoutCancel(ctx)
		hardCtx, hard := context.WithCancelCause(base)
		softCtx, soft := context.WithCancelCause(context.WithValue(hardCtx, workKey{}, hardCtx))
		r.soft, r.hard = soft, hard
		s.run = r
		// Hold the lock through launch: a Stop racing with Start waits for
		// the run to exist in full, so it never misses a goroutine. launch
		// must therefore not call the Service's methods (Group's are fine).
		err := launch(softCtx, &Group{s: s, r: r})
		go func() {
			r.wg.Wait()
			soft(ErrStopped)
			hard(ErrStopped)
			close(r.done)
		}()
		if err != nil {
			s.run = nil
			s.prev = r
			soft(err)
			hard(err)
			s.mu.Unlock()
			<-r.done
			return err
		}
		s.mu.Unlock()
		return nil
	}
}

// Stop is the soft stop; see the package doc. It returns the first error a
// goroutine of the run reported with Fail, if any.
func (s *Service) Stop(ctx context.Context) error { return s.stop(ctx, false) }

// HardStop is the hard stop; see the package doc.
func (s *Service) HardStop(ctx context.Context) error { return s.stop(ctx, true) }

func (s *Service) stop(ctx context.Context, hard bool) error {
	s.mu.Lock()
	r := s.run
	if r == nil {
		r = s.prev
	}
	if r == nil {
		s.mu.Unlock()
		return nil
	}
	if s.run == r {
		s.run = nil
		s.prev = r
	}
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	r.soft(ErrStopped)
	if hard {
		r.hard(ErrHardStopped)
	}
	s.mu.Unlock()
	select {
	case <-r.done:
		s.mu.Lock()
		if s.prev == r {
			s.prev = nil
		}
		s.mu.Unlock()
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Failed delivers the error of a run that failed by itself before it was
// stopped (see Group.Fail): the lifecycle.Failer contract.
func (s *Service) Failed() <-chan error { return s.failedChan() }

func (s *Service) failedChan() chan error {
	s.failedOnce.Do(func() { s.failed = make(chan error, 1) })
	return s.failed
}

// Running reports whether a run is in progress and not being stopped.
func (s *Service) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.run != nil
}

// Done returns a channel closed when the current (or last) run's goroutines
// have all returned; nil if nothing was ever started.
func (s *Service) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.run != nil:
		return s.run.done
	case s.prev != nil:
		return s.prev.done
	}
	return nil
}

// WorkContext returns the context for work in hand of the run that gave
// ctx: it has ctx's values, survives the soft stop, and ends at the hard
// stop. Bound it with a timeout of your own. For a ctx that does not come
// from a run it is context.WithoutCancel(ctx), cancellable by the returned
// func.
func WorkContext(ctx context.Context) (context.Context, context.CancelFunc) {
	wc, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	if hard, ok := ctx.Value(workKey{}).(context.Context); ok {
		stop := context.AfterFunc(hard, func() { cancel(context.Cause(hard)) })
		return wc, func() { stop(); cancel(context.Canceled) }
	}
	return wc, func() { cancel(context.Canceled) }
}
