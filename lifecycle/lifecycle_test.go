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
	if err := <-done; err != nil {
		t.Fatal(err)
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
