// Package lifecycle runs a service's long-running parts and stops them in a
// fixed order, each within its own budget, when SIGTERM or SIGINT arrives.
//
// Usage:
//
//	g, _ := lifecycle.New(nil) // SIGTERM, SIGINT; SHUTDOWN_TIMEOUT-like budget
//	g.Add(lifecycle.Stage{Name: "http", Budget: 10 * time.Second, Components: []lifecycle.Component{lifecycle.NewHTTPServer(srv, ln)}})
//	g.Add(lifecycle.Stage{Name: "consumers", Components: []lifecycle.Component{consumer}})
//	g.Add(lifecycle.Stage{Name: "relay", Components: []lifecycle.Component{relay, purger}})
//	g.Add(lifecycle.Stage{Name: "pool", Components: []lifecycle.Component{lifecycle.Closer(pool.Close)}})
//	err := g.Run(ctx) // starts all, waits for the signal, stops in order
//
// # How the stop runs
//
// A [Group] holds stages in stop order. Run starts every component (the last
// stage first, so that the pool exists before the HTTP server that uses
// it), marks the group ready, and waits. On the first trigger — a signal,
// the end of Run's context, or a component's failure, whether every
// component has started yet or not — it:
//
//  1. turns readiness off, so /readyz answers 503 while the listener is
//     still open, and (if the group had become ready) waits
//     Config.DrainDelay for load balancers to notice;
//  2. cancels the ctx of a Start still in progress, so that a start
//     blocked on a dependency gives up, and starts nothing more;
//  3. stops the stages one after another: every component of a stage gets
//     Stop with a context that ends a hard-stop window
//     (Config.HardStopTimeout, at most a quarter of the stage) before the
//     stage's deadline. A component still running then is hard-stopped
//     (HardStop, if it implements [HardStopper]) and, at the stage's
//     deadline, the group moves on to the next stage whether or not it has
//     returned. A Start still running counts as part of its stage's stop;
//  4. logs each stage, its outcome and its duration with log/slog.
//
// A second signal during the shutdown means "stop now": every component not
// yet stopped is hard-stopped at once and Run returns [ErrHardStop].
//
// Components follow the start/stop contract of every long-running part of
// idem (docs/conventions.md): Start(ctx) launches and returns, ctx bounding
// the start only; Stop(ctx) is the soft stop; HardStop(ctx) abandons the
// work in hand; Stop and HardStop are safe before Start, twice and
// concurrently. idem's own components (the outbox relay, the Kafka
// consumer, the purgers) satisfy [Component] and [HardStopper] directly.
// Adapters for the rest: [HTTPServer] (stop accepting, let the requests
// already received reach their handlers, then http.Server.Shutdown; Close
// as the hard stop), [Task] with [WorkContext] for loops whose batch in
// hand must survive the soft stop, [Closer] for pools and clients, [Funcs]
// for anything else.
//
// # What it guarantees
//
// The stop is bounded: Run returns no later than Config.ShutdownTimeout
// after the first trigger, however the components behave, a Start that
// never returns included (after a second signal: within two
// HardStopTimeouts of it, and still within ShutdownTimeout). Each stage's
// explicit budget is reserved, and a stage's hard stop happens inside its
// own budget: an earlier stage that overruns, even one whose hard stop
// hangs, cannot eat the time of a later one, so the pool is always closed
// after the consumers, never instead of them.
//
// The outcome is reported: Run returns nil only for a clean stop (every
// stage within its budget, no component error, no second signal). A stage
// whose components needed their hard stop, and returned from it within the
// stage's budget, is clean: it is logged at Warn with the soft deadline it
// passed and the number hard-stopped. A stage still running at the end of
// its budget (a component ignored even its hard stop) is a
// [*StageCutOffError] matching [ErrStageCutOff], one per stage, so that a
// supervisor (or a chaos test) can tell a bounded stop from a clean one. A shutdown that begins before the group is ready is
// clean if what had started stops cleanly.
//
// # What it does not guarantee
//
// It does not make work complete. A component cut off at its deadline
// leaves its work in hand undone; that work must be safe to repeat (an
// uncommitted Kafka offset, an outbox row still PENDING, an idempotency key
// whose lease expires). Graceful shutdown buys time; idempotency makes the
// time that was not enough harmless. A goroutine of a component that ignores
// even its hard stop is abandoned, not killed: the process exits around it.
// A Start that ignores its ctx is abandoned the same way; if it returns
// later, the component is stopped then.
package lifecycle
