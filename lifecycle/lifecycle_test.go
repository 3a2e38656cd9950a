package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/startstop"
	"github.com/idemkit/idem/lifecycle"
)

func quietGroup(t *testing.T, cfg lifecycle.Config) *lifecycle.Group {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Signals = []os.Signal{} // the trigger is Run's ctx
	g, err := lifecycle.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name string
		cfg  lifecycle.Config
	}{
		{"negative timeout", lifecycle.Config{ShutdownTimeout: -1}},
		{"negative hard stop", lifecycle.Config{HardStopTimeout: -1}},
		{"drain eats all", lifecycle.Config{ShutdownTimeout: time.Second, DrainDelay: time.Second}},
	}
	for _, tt := range testCases {
		if _, err := lifecycle.New(&tt.cfg); !errors.Is(err, lifecycle.ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", tt.name, err)
		}
	}
	g, err := lifecycle.New(&lifecycle.Config{ShutdownTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Add(lifecycle.Stage{Name: "a", Budget: 6 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(lifecycle.Stage{Name: "b", Budget: 6 * time.Second}); !errors.Is(err, lifecycle.ErrInvalidConfig) {
		t.Errorf("budgets over the timeout: err %v", err)
	}
	if err := g.Add(lifecycle.Stage{Budget: time.Second}); !errors.Is(err, lifecycle.ErrInvalidConfig) {
		t.Errorf("unnamed stage: err %v", err)
	}
	if err := g.Add(lifecycle.Stage{Name: "c", Components: []lifecycle.Component{nil}}); !errors.Is(err, lifecycle.ErrInvalidConfig) {
		t.Errorf("nil component: err %v", err)
	}
}

// TestStopBeforeStartAndTwice proves the shared contract of the adapters:
// Stop and HardStop before Start do nothing, and every call is safe twice.
func TestStopBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	runs := 0
	task := lifecycle.Go("t", func(ctx context.Context) error { runs++; <-ctx.Done(); return ctx.Err() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srv := lifecycle.NewHTTPServer(&http.Server{Handler: http.NotFoundHandler()}, ln)
	closes := 0
	closer := lifecycle.Closer(func() { closes++ })
	comps := []lifecycle.Component{task, srv, closer}
	for _, c := range comps {
		if err := c.Stop(ctx); err != nil {
			t.Errorf("%T Stop before Start: %v", c, err)
		}
		if hs, ok := c.(lifecycle.HardStopper); ok {
			if err := hs.HardStop(ctx); err != nil {
				t.Errorf("%T HardStop before Start: %v", c, err)
			}
		}
	}
	if closes != 0 {
		t.Fatal("Closer closed before Start")
	}
	for _, c := range comps {
		for range 2 {
			if err := c.Start(ctx); err != nil {
				t.Fatalf("%T Start: %v", c, err)
			}
		}
	}
	for _, c := range comps {
		for range 2 {
			if err := c.Stop(ctx); err != nil {
				t.Errorf("%T Stop: %v", c, err)
			}
		}
	}
	if runs != 1 || closes != 1 {
		t.Fatalf("task ran %d times, closer closed %d times; want 1 and 1", runs, closes)
	}
}

// TestWorkContextSurvivesSoftStop proves the batch-context pattern: the
// work in hand keeps running through the soft stop and is cancelled by the
// hard stop.
func TestWorkContextSurvivesSoftStop(t *testing.T) {
	t.Parallel()
	inHand := make(chan struct{})
	result := make(chan error, 1)
	task := lifecycle.Go("batch", func(ctx context.Context) error {
		work, cancel := lifecycle.WorkContext(ctx)
		defer cancel()
		close(inHand)
		<-ctx.Done() // the soft stop arrives while the batch is in hand
		select {
		case <-work.Done():
			result <- errors.New("work context cancelled by the soft stop")
		default:
		}
		<-work.Done()
		result <- nil
		return nil
	})
	if err := task.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-inHand
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := task.Stop(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("soft Stop returned %v while the batch was in hand", err)
	}
	if err := task.HardStop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-result; err != nil {
		t.Fatal(err)
	}
}

// TestFailedComponentTriggersShutdown proves that a component ending on its
// own stops the rest in order and makes Run return its error.
func TestFailedComponentTriggersShutdown(t *testing.T) {
	t.Parallel()
	g := quietGroup(t, lifecycle.Config{ShutdownTimeout: 10 * time.Second})
	boom := errors.New("boom")
	var mu sync.Mutex
	var stopped []string
	rec := func(name string) lifecycle.Component {
		return &lifecycle.Funcs{StopFunc: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			stopped = append(stopped, name)
			return nil
		}}
	}
	fail := make(chan struct{})
	_ = g.Add(lifecycle.Stage{Name: "first", Components: []lifecycle.Component{rec("first")}})
	_ = g.Add(lifecycle.Stage{Name: "failing", Budget: time.Second, Components: []lifecycle.Component{
		lifecycle.Go("consumer", func(ctx context.Context) error { <-fail; return boom }),
	}})
	_ = g.Add(lifecycle.Stage{Name: "last", Budget: time.Second, Components: []lifecycle.Component{rec("last")}})
	done := make(chan error, 1)
	go func() { done <- g.Run(context.Background()) }()
	close(fail)
	err := <-done
	if !errors.Is(err, boom) {
		t.Fatalf("Run: %v, want boom", err)
	}
	if len(stopped) != 2 || stopped[0] != "first" || stopped[1] != "last" {
		t.Fatalf("stopped %v", stopped)
	}
	if err := g.Run(context.Background()); !errors.Is(err, lifecycle.ErrAlreadyRun) {
		t.Fatalf("second Run: %v", err)
	}
}

// TestStartFailureStopsWhatStarted proves that a failed Start stops the
// components already started and starts nothing after it.
func TestStartFailureStopsWhatStarted(t *testing.T) {
	t.Parallel()
	g := quietGroup(t, lifecycle.Config{})
	bad := errors.New("no listener")
	var stopped, startedHTTP bool
	_ = g.Add(lifecycle.Stage{Name: "http", Components: []lifecycle.Component{&lifecycle.Funcs{
		StartFunc: func(context.Context) error { startedHTTP = true; return nil },
	}}})
	_ = g.Add(lifecycle.Stage{Name: "worker", Components: []lifecycle.Component{&lifecycle.Funcs{
		StartFunc: func(context.Context) error { return bad },
	}}})
	_ = g.Add(lifecycle.Stage{Name: "pool", Components: []lifecycle.Component{&lifecycle.Funcs{
		StopFunc: func(context.Context) error { stopped = true; return nil },
	}}})
	if err := g.Run(context.Background()); !errors.Is(err, bad) {
		t.Fatalf("Run: %v", err)
	}
	if !stopped || startedHTTP {
		t.Fatalf("pool stopped %v (want true), http started %v (want false)", stopped, startedHTTP)
	}
}

func TestReadyHandler(t *testing.T) {
	t.Parallel()
	g := quietGroup(t, lifecycle.Config{})
	h := g.ReadyHandler()
	status := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		return rec.Code
	}
	if status() != http.StatusServiceUnavailable {
		t.Fatal("ready before Run")
	}
	started := make(chan struct{})
	_ = g.Add(lifecycle.Stage{Name: "probe", Components: []lifecycle.Component{&lifecycle.Funcs{
		StopFunc: func(context.Context) error {
			if status() != http.StatusServiceUnavailable {
				t.Error("ready during the shutdown")
			}
			return nil
		},
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	go func() {
		for !g.Ready() {
			time.Sleep(time.Millisecond) // polling interval
		}
		close(started)
	}()
	<-started
	if status() != http.StatusOK {
		t.Fatal("not ready after start")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestStartContextOutlivesTrigger proves that a component tying its
// lifetime to Start's ctx (the outbox relay, the Kafka consumer) is not
// stopped by the end of Run's ctx, but only in its turn.
func TestStartContextOutlivesTrigger(t *testing.T) {
	t.Parallel()
	var startCtx context.Context
	errAtStop := make(chan error, 1)
	g2 := quietGroup(t, lifecycle.Config{})
	_ = g2.Add(lifecycle.Stage{Name: "first", Components: []lifecycle.Component{&lifecycle.Funcs{
		StopFunc: func(context.Context) error { errAtStop <- startCtx.Err(); return nil },
	}}})
	_ = g2.Add(lifecycle.Stage{Name: "relay", Budget: time.Second, Components: []lifecycle.Component{&lifecycle.Funcs{
		StartFunc: func(ctx context.Context) error { startCtx = ctx; return nil },
	}}})
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g2.Run(ctx2) }()
	for !g2.Ready() {
		time.Sleep(time.Millisecond) // polling interval
	}
	cancel2()
	if err := <-errAtStop; err != nil {
		t.Fatalf("relay's start ctx ended before its stage: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestLaterStageKeepsItsBudget proves the reservation: a stage whose Stop
// and HardStop both hang for ever is abandoned at the end of its share, and
// the next stage still gets (about) its whole budget.
func TestLaterStageKeepsItsBudget(t *testing.T) {
	t.Parallel()
	g := quietGroup(t, lifecycle.Config{ShutdownTimeout: 2 * time.Second, HardStopTimeout: time.Second})
	release := make(chan struct{})
	defer close(release)
	hang := func(context.Context) error { <-release; return nil }
	_ = g.Add(lifecycle.Stage{Name: "stuck", Components: []lifecycle.Component{&lifecycle.Funcs{StopFunc: hang, HardStopFunc: hang}}})
	left := make(chan time.Duration, 1)
	_ = g.Add(lifecycle.Stage{Name: "pool", Budget: 800 * time.Millisecond, Components: []lifecycle.Component{&lifecycle.Funcs{
		StopFunc: func(ctx context.Context) error {
			d, _ := ctx.Deadline()
			left <- time.Until(d)
			return nil
		},
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	for !g.Ready() {
		time.Sleep(time.Millisecond) // polling interval
	}
	cancel()
	// The stuck stage is reported, by name, and only it.
	err := <-done
	var cut *lifecycle.StageCutOffError
	if !errors.Is(err, lifecycle.ErrStageCutOff) || !errors.As(err, &cut) || cut.Stage != "stuck" || cut.Abandoned != 1 ||
		strings.Contains(err.Error(), `"pool"`) {
		t.Fatalf("Run = %v, want ErrStageCutOff for stage stuck (1 abandoned) only", err)
	}
	// 800 ms minus the hard-stop window (a quarter): about 600 ms.
	if d := <-left; d < 300*time.Millisecond {
		t.Fatalf("the later stage got %s of its 800ms budget", d)
	}
}

// TestHTTPStopAnswersRequestsAlreadyAccepted proves the drain before
// Shutdown: a connection accepted before the stop whose request arrives
// after it still gets its answer (plain Shutdown would close it unanswered),
// and a new connection after the stop is refused.
func TestHTTPStopAnswersRequestsAlreadyAccepted(t *testing.T) {
	t.Parallel()
	accepted := make(chan struct{}, 1)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("answered")) }),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				select {
				case accepted <- struct{}{}:
				default:
				}
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := lifecycle.NewHTTPServer(srv, ln)
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	<-accepted
	stopped := make(chan error, 1)
	go func() { stopped <- h.Stop(context.Background()) }()
	// The listener closes before the stop waits for our request.
	for {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(time.Millisecond) // polling interval
	}
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(conn)
	if err != nil || !strings.Contains(string(body), "answered") {
		t.Fatalf("response %q, %v", body, err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// TestRunCtxCancelsBlockingStart proves the in-process side of the signal
// test: the end of Run's ctx while a Start blocks cancels that Start's ctx,
// the components started before it stop, the ones after it never start,
// and Run returns nil.
func TestRunCtxCancelsBlockingStart(t *testing.T) {
	t.Parallel()
	g := quietGroup(t, lifecycle.Config{ShutdownTimeout: 10 * time.Second})
	var mu sync.Mutex
	var events []string
	rec := func(e string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}
	blocking := make(chan struct{})
	_ = g.Add(lifecycle.Stage{Name: "later", Components: []lifecycle.Component{&lifecycle.Funcs{
		StartFunc: func(context.Context) error { rec("start later"); return nil },
	}}})
	_ = g.Add(lifecycle.Stage{Name: "slow", Budget: time.Second, Components: []lifecycle.Component{&lifecycle.Funcs{
		StartFunc: func(ctx context.Context) error {
			close(blocking)
			<-ctx.Done()
			rec("start cancelled")
			return ctx.Err()
		},
		StopFunc: func(context.Context) error { rec("stop slow"); return nil },
	}}})
	_ = g.Add(lifecycle.Stage{Name: "pool", Budget: time.Second, Components: []lifecycle.Component{&lifecycle.Funcs{
		StopFunc: func(context.Context) error { rec("stop pool"); return nil },
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	<-blocking
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if got := strings.Join(events, ","); got != "start cancelled,stop pool" {
		t.Fatalf("events %s, want start cancelled,stop pool", got)
	}
	if g.Ready() {
		t.Fatal("ready after Run")
	}
}

// TestAbandonedStartIsStoppedWhenItReturns proves that a Start that ignores
// its ctx past the shutdown is cut off (Run names its stage and returns on
// time), and that when it finally returns, the component it started is
// stopped instead of being left running.
func TestAbandonedStartIsStoppedWhenItReturns(t *testing.T) {
	t.Parallel()
	g := quietGroup(t, lifecycle.Config{ShutdownTimeout: 400 * time.Millisecond, HardStopTimeout: 100 * time.Millisecond})
	release := make(chan struct{})
	blocking := make(chan struct{})
	stopped := make(chan string, 2)
	_ = g.Add(lifecycle.Stage{Name: "slow", Components: []lifecycle.Component{&lifecycle.Funcs{
		StartFunc:    func(context.Context) error { close(blocking); <-release; return nil },
		StopFunc:     func(context.Context) error { stopped <- "stop"; return nil },
		HardStopFunc: func(context.Context) error { stopped <- "hardstop"; return nil },
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	<-blocking
	cancel()
	err := <-done
	var cut *lifecycle.StageCutOffError
	if !errors.As(err, &cut) || cut.Stage != "slow" || cut.HardStopped != 1 {
		t.Fatalf("Run = %v, want stage slow cut off, its component hard-stopped", err)
	}
	select {
	case e := <-stopped:
		t.Fatalf("%s before the Start returned", e)
	default:
	}
	close(release)
	got := map[string]bool{<-stopped: true, <-stopped: true}
	if !got["stop"] || !got["hardstop"] {
		t.Fatalf("late component got %v, want stop and hardstop", got)
	}
}

// TestFailureDuringBlockingStart proves that a component failing while a
// later Start blocks begins the shutdown at once: the blocked Start is
// cancelled and Run returns the failure, not a start error.
func TestFailureDuringBlockingStart(t *testing.T) {
	t.Parallel()
	g := quietGroup(t, lifecycle.Config{ShutdownTimeout: 10 * time.Second})
	boom := errors.New("boom")
	fail := make(chan struct{})
	_ = g.Add(lifecycle.Stage{Name: "slow", Budget: time.Second, Components: []lifecycle.Component{&lifecycle.Funcs{
		StartFunc: func(ctx context.Context) error { close(fail); <-ctx.Done(); return ctx.Err() },
	}}})
	_ = g.Add(lifecycle.Stage{Name: "consumer", Budget: time.Second, Components: []lifecycle.Component{
		lifecycle.Go("consumer", func(ctx context.Context) error { <-fail; return boom }),
	}})
	err := g.Run(context.Background())
	if !errors.Is(err, boom) || strings.Contains(err.Error(), "start slow") {
		t.Fatalf("Run = %v, want boom only", err)
	}
	if strings.Count(err.Error(), "boom") != 1 {
		t.Fatalf("Run = %q: the failure is repeated", err)
	}
}

// TestTaskRestartsAfterStop proves Task's start/stop contract, the one of
// every component: Start after a completed stop runs the function afresh.
func TestTaskRestartsAfterStop(t *testing.T) {
	t.Parallel()
	runs := make(chan struct{}, 3)
	task := lifecycle.Go("t", func(ctx context.Context) error { runs <- struct{}{}; <-ctx.Done(); return ctx.Err() })
	for range 3 {
		if err := task.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		<-runs
		if err := task.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTaskFailureIsDeliveredAndReturned proves that a Task whose function
// returns before its stop reports it once on Failed and from Stop.
func TestTaskFailureIsDeliveredAndReturned(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	task := lifecycle.Go("t", func(ctx context.Context) error { return boom })
	if err := task.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-task.Failed(); !errors.Is(err, boom) || !strings.Contains(err.Error(), "task t") {
		t.Fatalf("Failed = %v", err)
	}
	if err := task.Stop(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Stop = %v, want boom", err)
	}
}

// startstopLoop is a component built directly on internal/startstop, as
// the relay, the consumer and the purgers are.
type startstopLoop struct {
	svc  startstop.Service
	work chan error
}

func (l *startstopLoop) Start(ctx context.Context) error {
	return l.svc.Start(ctx, func(ctx context.Context, g *startstop.Group) error {
		g.Go(ctx, func(ctx context.Context) {
			work, cancel := lifecycle.WorkContext(ctx)
			defer cancel()
			<-ctx.Done()
			select {
			case <-work.Done():
				l.work <- errors.New("work context ended at the soft stop")
				return
			default:
			}
			<-work.Done()
			l.work <- nil
		})
		return nil
	})
}

func (l *startstopLoop) Stop(ctx context.Context) error     { return l.svc.Stop(ctx) }
func (l *startstopLoop) HardStop(ctx context.Context) error { return l.svc.HardStop(ctx) }

// TestOneWorkContext proves that lifecycle.WorkContext is the work context
// of every component, not only of Task: taken from the run of a component
// built on internal/startstop, it survives that component's soft stop and
// ends at its hard stop.
func TestOneWorkContext(t *testing.T) {
	t.Parallel()
	l := &startstopLoop{work: make(chan error, 1)}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.Stop(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("soft Stop = %v while work was in hand", err)
	}
	if err := l.HardStop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-l.work; err != nil {
		t.Fatal(err)
	}
}
