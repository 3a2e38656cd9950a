package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Component is one long-running part of a service.
//
// Start launches the component's background work and returns; its ctx
// governs the start only (connecting, listening), not the component's
// lifetime. Stop is the soft stop: take no new work, finish the work in hand,
// return. Its ctx is the stop's budget: when it ends, Stop should give up
// and return ctx.Err(). Both must be safe to call twice, and Stop safe to
// call before Start (it then does nothing).
type Component interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// HardStopper is implemented by components that can abandon their work in
// hand: cancel in-flight calls, close connections. The Group calls HardStop
// when Stop overruns its stage's budget, and on a second signal. The ctx
// bounds the hard stop itself. Must be safe to call at any time, twice.
type HardStopper interface {
	HardStop(ctx context.Context) error
}

// Failer is implemented by components whose work can end by itself, such as
// a server whose listener fails. When Failed delivers an error before the
// component was stopped, the Group begins its shutdown and Run returns that
// error.
type Failer interface {
	Failed() <-chan error
}

// Stage is one step of the stop order.
type Stage struct {
	// Name appears in the logs.
	Name string
	// Budget bounds the stage's soft stop. It is reserved: earlier stages
	// can never use it. Zero means "whatever time is left", minus the
	// budgets reserved by later stages.
	Budget time.Duration
	// Components are stopped concurrently within the stage.
	Components []Component
}

// Defaults for Config.
const (
	ShutdownTimeoutDefault = 25 * time.Second
	HardStopTimeoutDefault = time.Second
	DrainDelayDefault      = 0
)

// Config configures a Group. A nil Config means all defaults.
type Config struct {
	// ShutdownTimeout bounds the whole shutdown, from the first signal to
	// Run's return. Keep it below the orchestrator's grace period (30 s in
	// Kubernetes) so that the process exits before SIGKILL. Defaults to
	// ShutdownTimeoutDefault (25 s).
	ShutdownTimeout time.Duration
	// HardStopTimeout bounds the hard-stop window at the end of each stage
	// (taken from the stage's own budget, at most a quarter of it) and the
	// hard stop that follows a second signal. Defaults to
	// HardStopTimeoutDefault (1 s).
	HardStopTimeout time.Duration
	// DrainDelay is how long the group stays up, not ready, before the first
	// stage stops: the time load balancers need to see /readyz fail and stop
	// sending new connections. It comes out of ShutdownTimeout. Defaults to
	// DrainDelayDefault (0).
	DrainDelay time.Duration
	// Logger receives one record per stage and per shutdown event. Defaults
	// to slog.Default().
	Logger *slog.Logger
	// Signals start the shutdown; the second one received forces a hard
	// stop. Defaults to SIGINT and SIGTERM. An empty, non-nil slice
	// disables signal handling (Run's ctx is then the only trigger).
	Signals []os.Signal
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.ShutdownTimeout == 0 {
		out.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if out.HardStopTimeout == 0 {
		out.HardStopTimeout = HardStopTimeoutDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Signals == nil {
		out.Signals = []os.Signal{os.Interrupt, syscall.SIGTERM}
	}
	return out
}

func (c *Config) validate() error {
	switch {
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("%w: ShutdownTimeout %s is negative", ErrInvalidConfig, c.ShutdownTimeout)
	case c.HardStopTimeout < 0:
		return fmt.Errorf("%w: HardStopTimeout %s is negative", ErrInvalidConfig, c.HardStopTimeout)
	case c.DrainDelay < 0:
		return fmt.Errorf("%w: DrainDelay %s is negative", ErrInvalidConfig, c.DrainDelay)
	case c.DrainDelay >= c.ShutdownTimeout:
		return fmt.Errorf("%w: DrainDelay %s leaves nothing of ShutdownTimeout %s", ErrInvalidConfig, c.DrainDelay, c.ShutdownTimeout)
	}
	return nil
}

// Errors returned by this package. Use errors.Is.
var (
	// ErrInvalidConfig is returned by New and Add for a bad Config or Stage.
	ErrInvalidConfig = errors.New("lifecycle: invalid config")
	// ErrHardStop is returned by Run when a second signal forced a hard stop.
	ErrHardStop = errors.New("lifecycle: hard stop on second signal")
	// ErrAlreadyRun is returned by Run when called a second time, and by Add
	// after Run.
	ErrAlreadyRun = errors.New("lifecycle: group already run")
)

// Group runs components and stops them in stage order. See the package doc.
type Group struct {
	cfg    Config
	mu     sync.Mutex
	stages []Stage
	ran    bool
	ready  atomic.Bool
}

// New returns a Group with no stages.
func New(cfg *Config) (*Group, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Group{cfg: c}, nil
}

// Add appends a stage to the stop order. Stages stop in the order they were
// added and start in the reverse order.
func (g *Group) Add(s Stage) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ran {
		return ErrAlreadyRun
	}
	switch {
	case s.Name == "":
		return fmt.Errorf("%w: stage %d has no Name", ErrInvalidConfig, len(g.stages))
	case s.Budget < 0:
		return fmt.Errorf("%w: stage %q Budget %s is negative", ErrInvalidConfig, s.Name, s.Budget)
	}
	for i, c := range s.Components {
		if c == nil {
			return fmt.Errorf("%w: stage %q Components[%d] is nil", ErrInvalidConfig, s.Name, i)
		}
	}
	var reserved time.Duration
	for _, st := range g.stages {
		reserved += st.Budget
	}
	if reserved+s.Budget+g.cfg.DrainDelay > g.cfg.ShutdownTimeout {
		return fmt.Errorf("%w: stage %q Budget %s: budgets plus DrainDelay exceed ShutdownTimeout %s", ErrInvalidConfig, s.Name, s.Budget, g.cfg.ShutdownTimeout)
	}
	g.stages = append(g.stages, s)
	return nil
}

// Ready reports whether every component has started and no shutdown has
// begun.
func (g *Group) Ready() bool { return g.ready.Load() }

// ReadyHandler answers 200 while the group is Ready and 503 otherwise: before
// the components have started and from the first moment of the shutdown.
func (g *Group) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if !g.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
}

// Run starts every component, waits for a signal, the end of ctx or a
// component failure, then shuts down in stage order and returns.
//
// ctx is a trigger: its end begins the graceful shutdown exactly as a first
// signal does, and a start still in progress is abandoned between
// components. Components receive ctx's values but not its cancellation
// (context.WithoutCancel), because many tie their lifetime to Start's ctx
// and must stop in order, not all at once. The shutdown runs on its own
// deadline. Run returns nil after a clean shutdown (components cut off at
// their budget included: that is the designed outcome, logged as a warning),
// the error of a component that failed to start or failed while running,
// errors from Stop, or ErrHardStop.
func (g *Group) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.ran {
		g.mu.Unlock()
		return ErrAlreadyRun
	}
	g.ran = true
	stages := append([]Stage(nil), g.stages...)
	g.mu.Unlock()

	var sigs chan os.Signal
	if len(g.cfg.Signals) > 0 {
		// Buffered: a second signal must not be dropped while the first is
		// being handled (signal.Notify never blocks on send).
		sigs = make(chan os.Signal, 2)
		signal.Notify(sigs, g.cfg.Signals...)
		defer signal.Stop(sigs)
	}
	log := g.cfg.Logger

	// Start in reverse stop order: the pool before the workers using it,
	// the HTTP server last.
	var started []startedComponent
	failed := make(chan error, 1)
	watchDone := make(chan struct{})
	defer close(watchDone)
	reportFail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	var startErr error
	signalled := 0
startLoop:
	for i := len(stages) - 1; i >= 0; i-- {
		for _, c := range stages[i].Components {
			// A signal during a slow start must not be lost: check between
			// components.
			select {
			case <-sigs:
				signalled++
				startErr = errors.New("lifecycle: signal received during start")
				break startLoop
			default:
			}
			if err := ctx.Err(); err != nil {
				startErr = fmt.Errorf("lifecycle: start: %w", err)
				break startLoop
			}
			// Many components (the outbox relay, the Kafka consumer, river)
			// tie their lifetime to Start's ctx. Run's ctx is a shutdown
			// trigger, so passing it on would stop them all at once, out
			// of order, at the first signal: hand them its values only.
			if err := c.Start(context.WithoutCancel(ctx)); err != nil {
				startErr = fmt.Errorf("lifecycle: start %s: %w", stages[i].Name, err)
				break startLoop
			}
			started = append(started, startedComponent{stage: i, c: c})
			if f, ok := c.(Failer); ok {
				go watch(f, reportFail, watchDone)
			}
		}
	}
	if startErr != nil {
		log.Error("start failed, stopping what started", "error", startErr)
		stopErr := g.shutdown(stages, started, sigs, signalled)
		if errors.Is(stopErr, ErrHardStop) {
			return errors.Join(startErr, stopErr)
		}
		return startErr
	}

	g.ready.Store(true)
	log.Info("started", "stages", len(stages))

	var cause error
	select {
	case s := <-sigs:
		signalled++
		log.Info("shutdown begins", "signal", s.String())
	case <-ctx.Done():
		log.Info("shutdown begins", "reason", context.Cause(ctx).Error())
	case err := <-failed:
		cause = err
		log.Error("component failed, shutdown begins", "error", err)
	}
	err := g.shutdown(stages, started, sigs, signalled)
	return errors.Join(cause, err)
}

type startedComponent struct {
	stage int
	c     Component
}

func watch(f Failer, report func(error), done <-chan struct{}) {
	select {
	case err, ok := <-f.Failed():
		if ok && err != nil {
			report(err)
		}
	case <-done:
	}
}

// shutdown stops the started components stage by stage.
func (g *Group) shutdown(stages []Stage, started []startedComponent, sigs <-chan os.Signal, signalled int) error {
	g.ready.Store(false)
	log := g.cfg.Logger
	begin := time.Now()
	deadline := begin.Add(g.cfg.ShutdownTimeout)

	// hard is closed on the second signal; a goroutine turns the signal
	// into the close so that every wait below can select on it.
	hard := make(chan struct{})
	var hardOnce sync.Once
	done := make(chan struct{})
	defer close(done)
	forceHard := func() { hardOnce.Do(func() { close(hard) }) }
	if signalled >= 2 {
		forceHard()
	}
	if sigs != nil {
		go func() {
			n := signalled
			for {
				select {
				case s := <-sigs:
					n++
					if n >= 2 {
						log.Warn("second signal: hard stop", "signal", s.String())
						forceHard()
						return
					}
				case <-done:
					return
				}
			}
		}()
	}

	if g.cfg.DrainDelay > 0 {
		log.Info("draining: not ready, still serving", "delay", g.cfg.DrainDelay)
		t := time.NewTimer(g.cfg.DrainDelay)
		select {
		case <-t.C:
		case <-hard:
			t.Stop()
		}
	}

	byStage := make([][]Component, len(stages))
	for _, sc := range started {
		byStage[sc.stage] = append(byStage[sc.stage], sc.c)
	}

	var errs []error
	for i, st := range stages {
		comps := byStage[i]
		select {
		case <-hard:
			// Stop now: every component not yet stopped gets its hard
			// stop, concurrently, each bounded by HardStopTimeout.
			var rest []Component
			for _, cs := range byStage[i:] {
				rest = append(rest, cs...)
			}
			g.hardStopAll(rest, time.Now().Add(g.cfg.HardStopTimeout))
			log.Warn("hard stop done", "duration", time.Since(begin).Round(time.Millisecond))
			return errors.Join(append(errs, ErrHardStop)...)
		default:
		}
		var reservedLater time.Duration
		for _, later := range stages[i+1:] {
			reservedLater += later.Budget
		}
		stageDeadline := deadline.Add(-reservedLater)
		if st.Budget > 0 {
			if own := time.Now().Add(st.Budget); own.Before(stageDeadline) {
				stageDeadline = own
			}
		}
		if err := g.stopStage(st, comps, stageDeadline, hard); err != nil {
			errs = append(errs, err)
		}
	}
	select {
	case <-hard:
		// The second signal came during the last stage: it is honoured
		// (the stage was hard-stopped) and reported.
		errs = append(errs, ErrHardStop)
	default:
	}
	log.Info("shutdown complete", "duration", time.Since(begin).Round(time.Millisecond))
	return errors.Join(errs...)
}

// stopStage runs one stage; it returns by stageEnd (or HardStopTimeout after
// a second signal). The stage's time is split: the soft stop gets all but
// a hard-stop window of min(HardStopTimeout, a quarter of the stage), so
// that the hard stop happens inside the stage's own budget and never eats
// a later stage's. The components' Stop calls run concurrently on a context
// ending at the soft deadline; whatever is still running then (or when hard
// closes) is hard-stopped, and abandoned at stageEnd.
func (g *Group) stopStage(st Stage, comps []Component, stageEnd time.Time, hard <-chan struct{}) error {
	log := g.cfg.Logger
	t0 := time.Now()
	if len(comps) == 0 {
		log.Info("stage skipped", "stage", st.Name, "reason", "nothing started")
		return nil
	}
	window := min(g.cfg.HardStopTimeout, max(time.Until(stageEnd), 0)/4)
	softDeadline := stageEnd.Add(-window)
	ctx, cancel := context.WithDeadline(context.Background(), softDeadline)
	defer cancel()

	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(comps))
	for i, c := range comps {
		go func() { results <- result{i, c.Stop(ctx)} }()
	}
	pending := make(map[int]bool, len(comps))
	for i := range comps {
		pending[i] = true
	}
	var errs []error
	collect := func(r result) {
		delete(pending, r.i)
		if r.err != nil && !errors.Is(r.err, context.DeadlineExceeded) && !errors.Is(r.err, context.Canceled) {
			errs = append(errs, fmt.Errorf("lifecycle: stop %s: %w", st.Name, r.err))
		}
	}
	overran, forced := false, false
soft:
	for len(pending) > 0 {
		select {
		case r := <-results:
			collect(r)
		case <-ctx.Done():
			overran = true
			break soft
		case <-hard:
			forced = true
			break soft
		}
	}
	if len(pending) > 0 {
		// Cut off: hard-stop the stragglers, then wait a little for their
		// Stop to return; past that the stage is abandoned.
		var rest []Component
		for i := range pending {
			rest = append(rest, comps[i])
		}
		cut := stageEnd
		if forced {
			cut = time.Now().Add(g.cfg.HardStopTimeout)
		}
		g.hardStopAll(rest, cut)
		wait := time.NewTimer(time.Until(cut))
	wait:
		for len(pending) > 0 {
			select {
			case r := <-results:
				collect(r)
			case <-wait.C:
				break wait
			}
		}
		wait.Stop()
	}
	attrs := []any{"stage", st.Name, "duration", time.Since(t0).Round(time.Millisecond), "budget", stageEnd.Sub(t0).Round(time.Millisecond)}
	switch {
	case forced:
		log.Warn("stage hard-stopped", append(attrs, "abandoned", len(pending))...)
	case overran:
		log.Warn("stage exceeded its budget: cut off", append(attrs, "abandoned", len(pending))...)
	case len(errs) > 0:
		log.Error("stage stopped with errors", append(attrs, "error", errors.Join(errs...))...)
	default:
		log.Info("stage stopped", attrs...)
	}
	return errors.Join(errs...)
}

// hardStopAll calls HardStop on every component that has one, concurrently,
// and waits until they return or until, whichever is first.
func (g *Group) hardStopAll(comps []Component, until time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range comps {
		hs, ok := c.(HardStopper)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := hs.HardStop(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				g.cfg.Logger.Warn("hard stop failed", "error", err)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
	}
}
