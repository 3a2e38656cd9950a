package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/idemkit/idem/lifecycle"
)

// Example wires the stop order of the billing service: readiness off, the
// HTTP server, the consumers, the relay, the charge worker, the clients.
// Run returns after SIGTERM (here: after ctx ends) and the ordered stop.
func Example() {
	g, err := lifecycle.New(&lifecycle.Config{ShutdownTimeout: 25 * time.Second})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /readyz", g.ReadyHandler())
	srv := lifecycle.NewHTTPServer(&http.Server{Addr: "127.0.0.1:0", Handler: mux}, nil)

	relay := lifecycle.Go("relay", func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				return nil // soft stop: start no new batch
			case <-time.After(100 * time.Millisecond):
			}
			batch, cancel := lifecycle.WorkContext(ctx)
			batch, cancelTimeout := context.WithTimeout(batch, 5*time.Second)
			_ = batch // publish and mark the batch on this context
			cancelTimeout()
			cancel()
		}
	})

	_ = g.Add(lifecycle.Stage{Name: "http", Budget: 10 * time.Second, Components: []lifecycle.Component{srv}})
	_ = g.Add(lifecycle.Stage{Name: "relay", Budget: 5 * time.Second, Components: []lifecycle.Component{relay}})
	_ = g.Add(lifecycle.Stage{Name: "clients", Budget: time.Second, Components: []lifecycle.Component{
		lifecycle.Closer(func() { fmt.Println("clients closed") }),
	}})

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	fmt.Println(g.Run(ctx))
	// Output:
	// clients closed
	// <nil>
}

// ExampleStageCutOffError shows how a program tells a bounded stop from a
// clean one: a stage that overran its budget is named in Run's error, so
// the process can exit non-zero (billing serve exits 1) and a supervisor
// counts it.
func ExampleStageCutOffError() {
	g, err := lifecycle.New(&lifecycle.Config{
		ShutdownTimeout: time.Second,
		HardStopTimeout: 50 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		Signals:         []os.Signal{}, // the trigger is ctx
	})
	if err != nil {
		panic(err)
	}
	// A worker stuck in a call that ignores its contexts, even the hard
	// stop (the end of its WorkContext): it outlives its 200ms budget. (A
	// worker that ends at its hard stop within the budget is a clean stop,
	// logged at Warn.)
	release := make(chan struct{})
	defer close(release)
	worker := lifecycle.Go("worker", func(ctx context.Context) error {
		<-release
		return nil
	})
	_ = g.Add(lifecycle.Stage{Name: "worker", Budget: 200 * time.Millisecond, Components: []lifecycle.Component{worker}})

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for !g.Ready() {
			time.Sleep(time.Millisecond) // polling interval
		}
		cancel() // as SIGTERM would
	}()
	err = g.Run(ctx)
	var cut *lifecycle.StageCutOffError
	if errors.As(err, &cut) {
		fmt.Println("cut off:", cut.Stage, errors.Is(err, lifecycle.ErrStageCutOff))
	}
	// Output:
	// cut off: worker true
}

// Example_stopOrder is the usual stop order of a service built on idem,
// one stage per line below, each with its budget inside ShutdownTimeout:
// the HTTP server first (no new request starts anything), then the
// consumers (finish the record in hand, commit), then the relay and the
// purgers (finish the batch in hand), then the Kafka clients (flush),
// then an embedded broker if the program runs one, and the pool last,
// since every stage before it may still use it. Components start in the
// reverse order. Here each stage is a stand-in that prints its name; in a
// service the comment names what goes there.
func Example_stopOrder() {
	g, err := lifecycle.New(&lifecycle.Config{
		ShutdownTimeout: 25 * time.Second,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		Signals:         []os.Signal{}, // the trigger is ctx; a program keeps the default (SIGTERM, SIGINT)
	})
	if err != nil {
		panic(err)
	}
	stage := func(name string, budget time.Duration) {
		_ = g.Add(lifecycle.Stage{Name: name, Budget: budget, Components: []lifecycle.Component{
			&lifecycle.Funcs{StopFunc: func(context.Context) error { fmt.Println("stopped", name); return nil }},
		}})
	}
	stage("http", 10*time.Second)     // lifecycle.NewHTTPServer(srv, ln)
	stage("consumers", 5*time.Second) // *kafka.Consumer
	stage("relay", 5*time.Second)     // *outbox.Relay, *idempotency.Purger, *inbox.Purger
	stage("kafka", time.Second)       // lifecycle.Closer(client.Close) for each *kgo.Client
	stage("broker", time.Second)      // lifecycle.Closer(cluster.Close) for an embedded kfake
	stage("pool", time.Second)        // lifecycle.Closer(pool.Close)

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for !g.Ready() {
			time.Sleep(time.Millisecond) // polling interval
		}
		cancel() // as SIGTERM would
	}()
	fmt.Println(g.Run(ctx))
	// Output:
	// stopped http
	// stopped consumers
	// stopped relay
	// stopped kafka
	// stopped broker
	// stopped pool
	// <nil>
}
