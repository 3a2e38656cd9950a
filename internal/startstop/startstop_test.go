package startstop_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/startstop"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type ctxKey struct{}

// loop is a component with one goroutine that waits for its soft stop and
// then finishes "work in hand" on WorkContext until release is closed or
// the hard stop comes.
type loop struct {
	startstop.Service
	starts   atomic.Int32
	release  chan struct{}
	workErr  atomic.Value // error seen by the work in hand
	sawValue atomic.Bool
}

func (l *loop) Start(ctx context.Context) error {
	return l.Service.Start(ctx, func(ctx context.Context, g *startstop.Group) error {
		l.starts.Add(1)
		g.Go(ctx, func(ctx context.Context) {
			l.sawValue.Store(ctx.Value(ctxKey{}) == "v")
			work, cancel := startstop.WorkContext(ctx)
			defer cancel()
			<-ctx.Done()
			select {
			case <-l.release:
				l.workErr.Store(errors.New("none"))
			case <-work.Done():
				l.workErr.Store(context.Cause(work))
			}
		})
		return nil
	})
}

func newLoop() *loop { return &loop{release: make(chan struct{})} }

func TestStopBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	l := newLoop()
	if err := l.Stop(t.Context()); err != nil {
		t.Fatalf("Stop before Start = %v", err)
	}
	if err := l.HardStop(t.Context()); err != nil {
		t.Fatalf("HardStop before Start = %v", err)
	}
	if err := l.Start(context.WithValue(t.Context(), ctxKey{}, "v")); err != nil {
		t.Fatal(err)
	}
	if err := l.Start(t.Context()); err != nil {
		t.Fatalf("second Start = %v", err)
	}
	if n := l.starts.Load(); n != 1 {
		t.Fatalf("launched %d times, want 1", n)
	}
	close(l.release)
	if err := l.Stop(t.Context()); err != nil {
		t.Fatalf("Stop = %v", err)
	}
	if err := l.Stop(t.Context()); err != nil {
		t.Fatalf("second Stop = %v", err)
	}
	if !l.sawValue.Load() {
		t.Fatal("the run did not get Start's values")
	}
	if got := l.workErr.Load().(error).Error(); got != "none" {
		t.Fatalf("work in hand ended with %q on a soft stop", got)
	}
}

func TestStartCtxCancelledAfterStartDoesNotStop(t *testing.T) {
	t.Parallel()
	l := newLoop()
	ctx, cancel := context.WithCancel(t.Context())
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-l.Done():
		t.Fatal("cancelling Start's ctx stopped the run")
	case <-time.After(50 * time.Millisecond):
	}
	if !l.Running() {
		t.Fatal("not running after Start's ctx ended")
	}
	close(l.release)
	if err := l.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestHardStopEndsWorkContext(t *testing.T) {
	t.Parallel()
	l := newLoop()
	if err := l.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	if err := l.Stop(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("soft Stop with work held = %v, want DeadlineExceeded", err)
	}
	if err := l.HardStop(t.Context()); err != nil {
		t.Fatalf("HardStop = %v", err)
	}
	if err, _ := l.workErr.Load().(error); !errors.Is(err, startstop.ErrHardStopped) {
		t.Fatalf("work context cause = %v, want ErrHardStopped", err)
	}
}

func TestRestartAfterStop(t *testing.T) {
	t.Parallel()
	l := newLoop()
	close(l.release)
	for i := 0; i < 3; i++ {
		if err := l.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := l.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.starts.Load(); n != 3 {
		t.Fatalf("launched %d times, want 3", n)
	}
}

func TestStartDuringStopWaits(t *testing.T) {
	t.Parallel()
	l := newLoop()
	if err := l.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_ = l.Stop(short) // stop in progress: work held
	started := make(chan error, 1)
	go func() { started <- l.Start(t.Context()) }()
	select {
	case err := <-started:
		t.Fatalf("Start returned %v while the previous run was stopping", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(l.release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	if n := l.starts.Load(); n != 2 {
		t.Fatalf("launched %d times, want 2", n)
	}
	if err := l.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestLaunchErrorAbortsRun(t *testing.T) {
	t.Parallel()
	var s startstop.Service
	var ended atomic.Bool
	boom := errors.New("boom")
	err := s.Start(t.Context(), func(ctx context.Context, g *startstop.Group) error {
		g.Go(ctx, func(ctx context.Context) {
			w, cancel := startstop.WorkContext(ctx)
			defer cancel()
			<-w.Done() // only a hard stop ends this
			ended.Store(true)
		})
		return boom
	})
	if !errors.Is(err, boom) || !ended.Load() {
		t.Fatalf("Start = %v, goroutine ended %v", err, ended.Load())
	}
	if s.Running() {
		t.Fatal("running after a failed launch")
	}
}

func TestFailDeliveredOnceAndReturnedByStop(t *testing.T) {
	t.Parallel()
	var s startstop.Service
	boom := errors.New("listener died")
	if err := s.Start(t.Context(), func(ctx context.Context, g *startstop.Group) error {
		g.Go(ctx, func(ctx context.Context) {
			g.Fail(boom)
			g.Fail(errors.New("second"))
			<-ctx.Done()
		})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-s.Failed(); !errors.Is(err, boom) {
		t.Fatalf("Failed = %v", err)
	}
	if err := s.Stop(t.Context()); !errors.Is(err, boom) {
		t.Fatalf("Stop = %v, want the run's failure", err)
	}
	select {
	case err := <-s.Failed():
		t.Fatalf("second failure delivered: %v", err)
	default:
	}
}

func TestConcurrentStartStop(t *testing.T) {
	t.Parallel()
	l := newLoop()
	close(l.release)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				switch (i + j) % 3 {
				case 0:
					_ = l.Start(t.Context())
				case 1:
					_ = l.Stop(t.Context())
				default:
					_ = l.HardStop(t.Context())
				}
			}
		}()
	}
	wg.Wait()
	if err := l.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d := l.Done(); d != nil {
		select {
		case <-d:
		default:
			t.Fatal("a run is still alive after the final Stop")
		}
	}
}
