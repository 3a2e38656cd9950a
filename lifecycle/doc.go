// Package lifecycle runs a service's long-running parts and stops them in a
// fixed order, each within its own budget, when SIGTERM or SIGINT arrives.
//
// A [Group] holds stages in stop order. Run starts every component (the last
// stage first, so that the pool exists before the HTTP server that uses
// it), marks the group ready, and waits. On the first signal (or when Run's
// context ends, or a component fails) it:
//
//  1. turns readiness off, so /readyz answers 503 while the listener is
//     still open, and waits Config.DrainDelay for load balancers to notice;
//  2. stops the stages one after another: every component of a stage gets
//     Stop with a context that ends a hard-stop window
//     (Config.HardStopTimeout, at most a quarter of the stage) before the
//     stage's deadline. A component still running then is hard-stopped (HardStop, if
//     it implements [HardStopper]) and, at the stage's deadline, the group
//     moves on to the next stage whether or not it has returned;
//  3. logs each stage, its outcome and its duration with log/slog.
//
// A second signal during the shutdown means "stop now": every component not
// yet stopped is hard-stopped at once and Run returns [ErrHardStop].
//
// Adapters: [HTTPServer] (stop accepting, let the requests already received
// reach their handlers, then http.Server.Shutdown; Close as the hard stop),
// [Task] with [WorkContext] for loops whose batch in hand must survive the
// soft stop, [Closer] for pools and clients, [Funcs] for anything else.
//
// # What it guarantees
//
// The stop is bounded: Run returns no later than Config.ShutdownTimeout after
// the shutdown began, however the components behave (after a second
// signal: within two HardStopTimeouts of it). Each stage's explicit budget
// is reserved, and a stage's hard stop happens inside its own budget: an
// earlier stage that overruns, even one whose hard stop hangs, cannot eat
// the time of a later one, so the pool is always closed after the
// consumers, never instead of them.
//
// # What it does not guarantee
//
// It does not make work complete. A component cut off at its deadline
// leaves its work in hand undone; that work must be safe to repeat (an
// uncommitted Kafka offset, an outbox row still PENDING, an idempotency key
// whose lease expires). Graceful shutdown buys time; idempotency makes the
// time that was not enough harmless. A goroutine of a component that ignores
// even its hard stop is abandoned, not killed: the process exits around it.
package lifecycle
