package outbox

import (
	"context"
	"maps"

	"github.com/idemkit/idem"
)

// A Propagator writes the cross-process context that ctx carries into an
// event's headers when the event is enqueued: an OpenTelemetry span
// context as W3C traceparent and tracestate, say. The relay publishes the
// headers with the event (every publisher copies Message.Headers to the
// broker's headers), so the consumer's work continues the trace of the
// request that enqueued it, however long the event waited in the table.
//
// It has the shape of the injecting half of OpenTelemetry's
// propagation.TextMapPropagator with a map carrier (propagation.MapCarrier
// is a map[string]string), so that this module carries a trace without
// importing OpenTelemetry; package idemotel (module
// github.com/idemkit/idem/otel) provides one. Inject must be safe for
// concurrent use and must not keep headers.
type Propagator interface {
	Inject(ctx context.Context, headers map[string]string)
}

// MaxPropagatedBytes bounds each header a Propagator adds: a longer key or
// value is dropped. A trace context is far shorter (traceparent is 55
// bytes, tracestate at most 32 members); the bound is for a propagator
// that copies what an untrusted client sent (W3C baggage), which must not
// grow every outbox row and every broker message.
const MaxPropagatedBytes = 8 << 10

type propagatorKey struct{}

// ContextWithPropagator returns ctx carrying p. EnqueueTx and Enqueue
// called with it (or with a context derived from it) add p's headers to
// each message; so do the other enqueue functions of this module (package
// outbox/wal) that have EnqueueTx's signature, through InjectHeaders. The
// hooks of package idemotel return such a context for the work they begin
// (a guarded request, a consumed record), so a handler that enqueues needs
// nothing of its own. A nil p removes the propagator.
func ContextWithPropagator(ctx context.Context, p Propagator) context.Context {
	return context.WithValue(ctx, propagatorKey{}, p)
}

// PropagatorFromContext returns the Propagator ctx carries, or nil.
func PropagatorFromContext(ctx context.Context) Propagator {
	p, _ := ctx.Value(propagatorKey{}).(Propagator)
	return p
}

// InjectHeaders returns the headers of a message enqueued with ctx: h
// plus what ctx's Propagator writes (see ContextWithPropagator). h itself
// is never changed; without a propagator, or when it adds nothing, h is
// returned as is. A header the caller set wins over the propagator's (an
// event may carry a trace context of its own on purpose), and a header
// the propagator writes that EnqueueTx could not store (not valid UTF-8,
// a NUL byte, longer than MaxPropagatedBytes, a name idem reserves) is
// dropped rather than failing the caller's transaction over a trace.
func InjectHeaders(ctx context.Context, h map[string]string) map[string]string {
	p := PropagatorFromContext(ctx)
	if p == nil {
		return h
	}
	add := map[string]string{}
	p.Inject(ctx, add)
	var out map[string]string
	for k, v := range add {
		if _, set := h[k]; set || k == "" || len(k) > MaxPropagatedBytes || len(v) > MaxPropagatedBytes || !storable(k) || !storable(v) || idem.IsReservedHeader(k) {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(h)+len(add))
			maps.Copy(out, h)
		}
		out[k] = v
	}
	if out == nil {
		return h
	}
	return out
}
