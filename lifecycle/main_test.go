package lifecycle_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/lifecycle"
)

// helperEnv makes the test binary act as the service under test: the
// signal tests re-execute it, so that real signals hit a real process.
const helperEnv = "LIFECYCLE_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	goleak.VerifyTestMain(m)
}

// helperMain runs a Group built from LIFECYCLE_TEST_STAGES, a list of
// name:budget:behaviour separated by commas. Behaviours:
//
//	ok     Stop returns at once
//	gate   Stop waits for GET /release on the helper's HTTP server
//	hang   Stop ignores its ctx and returns only after HardStop
//	stuck  Stop and HardStop never return
//	http   the helper's HTTP server (/readyz, /release)
//	slowstart   Start blocks until its ctx ends ("event start-cancelled NAME")
//	stuckstart  Start ignores its ctx and never returns
//
// Every Start, Stop, its end and every HardStop print "event KIND NAME" on stdout;
// the HTTP server prints "addr HOST:PORT" once listening. Logs are JSON on
// stderr. LIFECYCLE_TEST_TIMEOUT sets ShutdownTimeout.
func helperMain() int {
	var out sync.Mutex
	event := func(kind, name string) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf("event %s %s\n", kind, name)
	}
	timeout, err := time.ParseDuration(os.Getenv("LIFECYCLE_TEST_TIMEOUT"))
	if err != nil {
		timeout = time.Minute
	}
	g, err := lifecycle.New(&lifecycle.Config{
		ShutdownTimeout: timeout,
		HardStopTimeout: 300 * time.Millisecond,
		Logger:          slog.New(slog.NewJSONHandler(os.Stderr, nil)),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	for _, spec := range strings.Split(os.Getenv("LIFECYCLE_TEST_STAGES"), ",") {
		parts := strings.Split(spec, ":")
		name, behaviour := parts[0], parts[2]
		budget, _ := time.ParseDuration(parts[1])
		var c lifecycle.Component
		switch behaviour {
		case "http":
			mux := http.NewServeMux()
			mux.Handle("GET /readyz", g.ReadyHandler())
			mux.HandleFunc("GET /release", func(w http.ResponseWriter, r *http.Request) {
				releaseOnce.Do(func() { close(release) })
			})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 3
			}
			out.Lock()
			fmt.Printf("addr %s\n", ln.Addr())
			out.Unlock()
			srv := lifecycle.NewHTTPServer(&http.Server{Handler: mux}, ln)
			c = &lifecycle.Funcs{
				StartFunc: func(ctx context.Context) error {
					event("start", name)
					return srv.Start(ctx)
				},
				StopFunc: func(ctx context.Context) error {
					event("stop-begin", name)
					defer event("stop-end", name)
					return srv.Stop(ctx)
				},
				HardStopFunc: srv.HardStop,
			}
		default:
			hard := make(chan struct{})
			c = &lifecycle.Funcs{
				StartFunc: func(ctx context.Context) error {
					event("start", name)
					switch behaviour {
					case "slowstart":
						<-ctx.Done()
						event("start-cancelled", name)
						return ctx.Err()
					case "stuckstart":
						select {}
					}
					return nil
				},
				StopFunc: func(ctx context.Context) error {
					event("stop-begin", name)
					switch behaviour {
					case "gate":
						<-release
					case "hang":
						<-hard
					case "stuck":
						select {}
					}
					event("stop-end", name)
					return nil
				},
				HardStopFunc: func(ctx context.Context) error {
					event("hardstop", name)
					close(hard)
					if behaviour == "stuck" {
						select {}
					}
					return nil
				},
			}
		}
		if err := g.Add(lifecycle.Stage{Name: name, Budget: budget, Components: []lifecycle.Component{c}}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
	if err := g.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		return 1
	}
	return 0
}
