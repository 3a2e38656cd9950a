package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Component is one long-running part of a service.
//
// Start launches the component's background work and returns; its ctx
// governs the start only (connecting, listening), not the component's
// lifetime: the Group cancels it when the shutdown begins during the start,
// and a Start should then give up and return an error. Stop is the soft
// stop: take no new work, finish the work in hand, return. Its ctx is the
// stop's budget: when it ends, Stop should give up and return ctx.Err().
// Both must be safe to call twice, and Stop safe to call before Start (it
// then does nothing). internal/startstop gives idem's components exactly
// this contract.
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
	// ShutdownTimeout bounds the whole shutdown, from the first trigger (a
	// signal, the end of Run's ctx, a failure), even one during the start,
	// to Run's return. Keep it below the orchestrator's grace period (30 s in
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
	// stop. An empty, non-nil slice disables signal handling (Run's ctx is
	// then the only trigger). Defaults to SIGINT and SIGTERM.
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
	// ErrStageCutOff is returned by Run, wrapped in one *StageCutOffError
	// per stage, when a stage was still running at the end of its budget:
	// its stragglers were hard-stopped and some ignored even that and were
	// abandoned, still running. The stop was bounded, as designed, but not
	// clean. A stage that passed its soft deadline and whose stragglers
	// returned from their hard stop within the budget is not cut off: it
	// is logged ("stage passed its soft deadline: hard-stopped within its
	// budget", with the soft deadline and the count hard-stopped) and the
	// stop is clean, because a hard stop abandons work in hand the
	// designed way (rolled back, redelivered later).
	ErrStageCutOff = errors.New("lifecycle: stage cut off at its budget")
)

// StageCutOffError names a stage that overran its budget. It matches
// ErrStageCutOff with errors.Is.
type StageCutOffError struct {
	// Stage is the stage's Name.
	Stage string
	// Budget is the time the stage had, hard-stop window included.
	Budget time.Duration
	// HardStopped is how many of its components were still running at the
	// soft deadline and got their hard stop.
	HardStopped int
	// Abandoned is how many of those had still not returned from Stop at
	// the end of the budget: their goroutines were left running.
	Abandoned int
}

func (e *StageCutOffError) Error() string {
	return fmt.Sprintf("lifecycle: stage %q cut off at its budget (%s): %d hard-stopped, %d abandoned",
		e.Stage, e.Budget, e.HardStopped, e.Abandoned)
}

// Is reports whether target is ErrStageCutOff.
func (e *StageCutOffError) Is(target error) bool { return target == ErrStageCutOff }

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
// The first trigger (a signal, the end of ctx, a component's failure)
// begins the shutdown, whether the components have all started or not, and
// ShutdownTimeout counts from that moment. ctx is a trigger only: its end
// begins the graceful shutdown exactly as a first signal does.
//
// Each component's Start gets a ctx of its own with ctx's values but not
// its cancellation. That ctx is cancelled when the shutdown begins while
// the Start is still running (a Start blocked connecting gives up), and
// otherwise only when Run returns: a component that ties its lifetime to
// Start's ctx, against the convention, is still stopped in its turn and not
// all at once. A Start still running when the shutdown begins is treated
// as part of its stage's stop: the stage waits for it within its budget,
// then stops (or hard-stops) the component if the Start succeeded; the
// stages after it in start order never start. A Start that ignores its
// ctx past its stage's budget is abandoned like a Stop that does.
//
// Run returns nil after a clean shutdown, including one that began before
// every component had started (a Start that returns an error because the
// shutdown cancelled it is not a failure). Otherwise it returns, joined:
// the error of a component that failed to start or failed while running,
// the errors of Stop calls, a *StageCutOffError (ErrStageCutOff) for every
// stage cut off at its budget, and ErrHardStop after a second signal.
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
	tr := newTrigger()
	failed := make(chan error, 1)
	watchDone := make(chan struct{})
	defer close(watchDone)
	go g.watchTriggers(ctx, sigs, failed, tr, watchDone)
	reportFail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}

	// Start in reverse stop order: the pool before the workers using it,
	// the HTTP server last. Each Start runs in a goroutine so that a
	// trigger is seen while it blocks (connecting to a broker that is
	// down, say): the wait for it then becomes part of the shutdown,
	// bounded like any stop.
	base := context.WithoutCancel(ctx)
	var startCancels []context.CancelFunc
	defer func() {
		for _, cancel := range startCancels {
			cancel()
		}
	}()
	var started []startedComponent
	var pending *pendingStart
	var startErr error
startLoop:
	for i := len(stages) - 1; i >= 0; i-- {
		for _, c := range stages[i].Components {
			if tr.hasBegun() {
				break startLoop
			}
			sctx, cancel := context.WithCancel(base)
			startCancels = append(startCancels, cancel)
			res := make(chan error, 1)
			go func() { res <- c.Start(sctx) }()
			select {
			case err := <-res:
				if err != nil {
					if tr.hasBegun() {
						log.Info("start interrupted by the shutdown", "stage", stages[i].Name, "error", err)
					} else {
						startErr = fmt.Errorf("lifecycle: start %s: %w", stages[i].Name, err)
					}
					break startLoop
				}
				started = append(started, startedComponent{stage: i, c: c})
				if f, ok := c.(Failer); ok {
					go watch(f, reportFail, watchDone)
				}
			case <-tr.begun:
				cancel()
				pending = newPendingStart(c, res, log, stages[i].Name, g.cfg.HardStopTimeout)
				started = append(started, startedComponent{stage: i, c: pending})
				break startLoop
			}
		}
	}
	wasReady := false
	switch {
	case startErr != nil:
		tr.begin(startErr, func() { log.Error("start failed, stopping what started", "error", startErr) })
	case !tr.hasBegun():
		g.ready.Store(true)
		wasReady = true
		log.Info("started", "stages", len(stages))
		<-tr.begun
	default:
		log.Info("shutdown began before every component had started")
	}
	cause := tr.failure()
	if startErr != nil && cause != startErr {
		// A failure began the shutdown just before the start failed too.
		cause = errors.Join(cause, startErr)
	}
	err := g.shutdown(stages, started, tr, wasReady, cause)
	if pending != nil {
		pending.abandon()
	}
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

// trigger records the shutdown's triggers: begun is closed by the first
// (a signal, the end of Run's ctx, a failure), hard by the second signal.
type trigger struct {
	begun, hard         chan struct{}
	beginOnce, hardOnce sync.Once
	mu                  sync.Mutex
	at                  time.Time // when begun closed
	cause               error     // the failure that began the shutdown, if one did
}

func newTrigger() *trigger {
	return &trigger{begun: make(chan struct{}), hard: make(chan struct{})}
}

// begin begins the shutdown, with cause for a failure or nil; the first
// call runs announce (a log line) before anything waiting on begun moves,
// so that the logs read in order.
func (t *trigger) begin(cause error, announce func()) {
	t.beginOnce.Do(func() {
		t.mu.Lock()
		t.at, t.cause = time.Now(), cause
		t.mu.Unlock()
		announce()
		close(t.begun)
	})
}

func (t *trigger) forceHard() { t.hardOnce.Do(func() { close(t.hard) }) }

func (t *trigger) hasBegun() bool {
	select {
	case <-t.begun:
		return true
	default:
		return false
	}
}

func (t *trigger) beganAt() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.at
}

func (t *trigger) failure() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cause
}

// watchTriggers turns signals, the end of ctx and failures into the
// trigger, for the whole of Run: before, during and after the start.
func (g *Group) watchTriggers(ctx context.Context, sigs <-chan os.Signal, failed <-chan error, tr *trigger, done <-chan struct{}) {
	log := g.cfg.Logger
	ctxDone := ctx.Done()
	signals := 0
	for {
		select {
		case s := <-sigs:
			signals++
			if signals >= 2 {
				log.Warn("second signal: hard stop", "signal", s.String())
				tr.forceHard()
			} else {
				tr.begin(nil, func() { log.Info("shutdown begins", "signal", s.String()) })
			}
		case <-ctxDone:
			ctxDone = nil
			tr.begin(nil, func() { log.Info("shutdown begins", "reason", context.Cause(ctx).Error()) })
		case err := <-failed:
			tr.begin(err, func() { log.Error("component failed, shutdown begins", "error", err) })
		case <-done:
			return
		}
	}
}

// pendingStart stands, in its stage, for a component whose Start was still
// running when the shutdown began (its ctx is cancelled by then). Its Stop
// waits, within the stage's budget, for that Start to return, then stops
// the component if it did start; its HardStop likewise. A Start that never
// returns leaves the stage cut off, and the component abandoned.
type pendingStart struct {
	c        Component
	log      *slog.Logger
	stage    string
	hardStop time.Duration
	resolved chan struct{} // closed once Start returned; err is then set
	err      error

	mu        sync.Mutex
	done      bool // Start returned
	reached   bool // Stop or HardStop was passed on to c
	abandoned bool // Run returned before Start did
}

func newPendingStart(c Component, res <-chan error, log *slog.Logger, stage string, hardStop time.Duration) *pendingStart {
	p := &pendingStart{c: c, log: log, stage: stage, hardStop: hardStop, resolved: make(chan struct{})}
	go func() {
		err := <-res
		p.mu.Lock()
		p.err, p.done = err, true
		abandoned := p.abandoned
		p.mu.Unlock()
		close(p.resolved)
		if err != nil {
			log.Info("start interrupted by the shutdown", "stage", stage, "error", err)
			return
		}
		if abandoned {
			p.stopLate()
		}
	}()
	return p
}

// Start is never called: the component's own Start is already running.
func (p *pendingStart) Start(context.Context) error { return nil }

// Stop waits for the Start, then stops the component if it started.
func (p *pendingStart) Stop(ctx context.Context) error {
	if started, err := p.wait(ctx); !started {
		return err
	}
	return p.c.Stop(ctx)
}

// HardStop waits for the Start, then hard-stops the component if it
// started.
func (p *pendingStart) HardStop(ctx context.Context) error {
	if started, err := p.wait(ctx); !started {
		return err
	}
	if hs, ok := p.c.(HardStopper); ok {
		return hs.HardStop(ctx)
	}
	return nil
}

// wait waits for the Start to return. It reports true when the Start
// succeeded (and records that a stop is being passed on to the component);
// false with nil when the Start failed, so there is nothing to stop; false
// with ctx.Err() when ctx ended first.
func (p *pendingStart) wait(ctx context.Context) (bool, error) {
	select {
	case <-p.resolved:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	if p.err != nil {
		return false, nil
	}
	p.mu.Lock()
	p.reached = true
	p.mu.Unlock()
	return true, nil
}

// abandon is called when Run returns: a Start that has not returned yet, or
// one that returned too late for its stage's stop, gets stopped on its own
// as soon as it can be (the process is usually exiting by then).
func (p *pendingStart) abandon() {
	p.mu.Lock()
	if !p.done {
		p.abandoned = true
		p.mu.Unlock()
		return
	}
	late := p.err == nil && !p.reached
	p.mu.Unlock()
	if late {
		go p.stopLate()
	}
}

func (p *pendingStart) stopLate() {
	p.log.Warn("a start abandoned by the shutdown returned late: stopping it", "stage", p.stage)
	ctx, cancel := context.WithTimeout(context.Background(), p.hardStop)
	defer cancel()
	if hs, ok := p.c.(HardStopper); ok {
		_ = hs.HardStop(ctx)
	}
	_ = p.c.Stop(ctx)
}

// shutdown stops the started components stage by stage, on a deadline of
// ShutdownTimeout from the moment the shutdown began. Errors that are (or
// wrap) cause, the failure that began the shutdown, are not repeated.
func (g *Group) shutdown(stages []Stage, started []startedComponent, tr *trigger, wasReady bool, cause error) error {
	g.ready.Store(false)
	log := g.cfg.Logger
	begin := tr.beganAt()
	deadline := begin.Add(g.cfg.ShutdownTimeout)
	hard := tr.hard
	// hardUntil bounds a hard stop: HardStopTimeout from now, never past
	// the whole shutdown's deadline.
	hardUntil := func() time.Time {
		if t := time.Now().Add(g.cfg.HardStopTimeout); t.Before(deadline) {
			return t
		}
		return deadline
	}

	if g.cfg.DrainDelay > 0 && wasReady {
		log.Info("draining: not ready, still serving", "delay", g.cfg.DrainDelay)
		t := time.NewTimer(time.Until(begin.Add(g.cfg.DrainDelay)))
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
			g.hardStopAll(rest, hardUntil())
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
		if err := g.stopStage(st, comps, stageDeadline, hard, hardUntil, cause); err != nil {
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
func (g *Group) stopStage(st Stage, comps []Component, stageEnd time.Time, hard <-chan struct{}, hardUntil func() time.Time, cause error) error {
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
	// stopped: components known to have stopped. A Stop that returns nil
	// or its own error has; one that returns its ctx's error (the soft
	// deadline came first) has not, and neither has the component until
	// its HardStop returns nil.
	stopped := make(map[int]bool, len(comps))
	collect := func(r result) {
		delete(pending, r.i)
		ctxErr := r.err != nil && (errors.Is(r.err, context.DeadlineExceeded) || errors.Is(r.err, context.Canceled))
		if !ctxErr {
			stopped[r.i] = true
		}
		if r.err != nil && !ctxErr && (cause == nil || !errors.Is(r.err, cause)) {
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
	// A Stop that gave up at the soft deadline (its ctx's error, collected
	// before or after the deadline was seen) is a straggler like one still
	// running.
	var stragglers []int
	for i := range comps {
		if !stopped[i] {
			stragglers = append(stragglers, i)
		}
	}
	if len(stragglers) > 0 {
		overran = overran || !forced
		// Cut off: hard-stop the stragglers, then wait a little for their
		// Stop to return; past that the stage is abandoned.
		var rest []Component
		for _, i := range stragglers {
			rest = append(rest, comps[i])
		}
		cut := stageEnd
		if forced {
			cut = hardUntil()
		}
		for j, ok := range g.hardStopAll(rest, cut) {
			if ok {
				stopped[stragglers[j]] = true
			}
		}
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
	hardStopped := len(stragglers)
	abandoned := 0
	for _, i := range stragglers {
		if !stopped[i] {
			abandoned++
		}
	}
	attrs := []any{"stage", st.Name, "duration", time.Since(t0).Round(time.Millisecond), "budget", stageEnd.Sub(t0).Round(time.Millisecond)}
	switch {
	case forced:
		log.Warn("stage hard-stopped", append(attrs, "abandoned", abandoned)...)
	case overran && abandoned == 0:
		// Past the soft deadline, the stragglers got their hard stop and
		// returned inside the stage's budget: their work in hand was
		// abandoned the designed way (rolled back, redelivered later), so
		// the stop is still a clean one; the log says which deadline was
		// passed and that a hard stop was needed, not a cut-off.
		log.Warn("stage passed its soft deadline: hard-stopped within its budget", append(attrs,
			"soft_deadline", softDeadline.Sub(t0).Round(time.Millisecond), "hard_stopped", hardStopped)...)
		if len(errs) > 0 {
			log.Error("stage stopped with errors", append(attrs, "error", errors.Join(errs...))...)
		}
	case overran:
		log.Warn("stage exceeded its budget: cut off", append(attrs,
			"soft_deadline", softDeadline.Sub(t0).Round(time.Millisecond), "hard_stopped", hardStopped, "abandoned", abandoned)...)
		errs = append(errs, &StageCutOffError{Stage: st.Name, Budget: stageEnd.Sub(t0).Round(time.Millisecond), HardStopped: hardStopped, Abandoned: abandoned})
	case len(errs) > 0:
		log.Error("stage stopped with errors", append(attrs, "error", errors.Join(errs...))...)
	default:
		log.Info("stage stopped", attrs...)
	}
	return errors.Join(errs...)
}

// hardStopAll calls HardStop on every component that has one, concurrently,
// and waits until they return or until, whichever is first. It reports,
// per component, whether its HardStop returned nil in time (the component
// has stopped); false for one without HardStop.
func (g *Group) hardStopAll(comps []Component, until time.Time) []bool {
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	var mu sync.Mutex
	ok := make([]bool, len(comps))
	var wg sync.WaitGroup
	for i, c := range comps {
		hs, has := c.(HardStopper)
		if !has {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := hs.HardStop(ctx)
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				g.cfg.Logger.Warn("hard stop failed", "error", err)
			}
			if err == nil && ctx.Err() == nil {
				mu.Lock()
				ok[i] = true
				mu.Unlock()
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(ok)
}
