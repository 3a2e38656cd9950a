package idemotel

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/outbox"
)

// Span attributes of idem's own (the semantic conventions have none for
// idempotency or an outbox).
const (
	// AttrOutcome: what became of the unit of work (see each hook).
	AttrOutcome = attribute.Key("idem.outcome")
	// AttrMode: the idempotency middleware's or the relay's mode.
	AttrMode = attribute.Key("idem.mode")
	// AttrClaim: claim or takeover, for a request whose handler ran.
	AttrClaim = attribute.Key("idem.claim")
	// AttrAttempt: the idemclient attempt (1-based).
	AttrAttempt = attribute.Key("idem.attempt")
	// AttrRetryReason: why an idemclient attempt failed.
	AttrRetryReason = attribute.Key("idem.retry_reason")
	// AttrReplayed: the answer was replayed from the server's store.
	AttrReplayed = attribute.Key("idem.replayed")
	// AttrDuplicate: the consumed record had been processed before.
	AttrDuplicate = attribute.Key("idem.duplicate")
	// AttrDeadLettered: the consumed record went to the dead-letter
	// destination.
	AttrDeadLettered = attribute.Key("idem.dead_lettered")
	// AttrPublished, AttrFailed, AttrHeld: a relay batch's tally.
	AttrPublished = attribute.Key("idem.published")
	AttrFailed    = attribute.Key("idem.failed")
	AttrHeld      = attribute.Key("idem.held")
)

type requestSpanKey struct{}

// RequestHook is idempotency.Config.Hook (and paysim.Config.Hook): a span
// per guarded request and the idempotency metrics.
//
// The span starts at EventBegin as a child of the request's ctx (Handler
// extracted the caller's trace context there). It is the request's server
// span (kind server, named "METHOD route") when nothing local started one
// before it, and an internal span ("idempotent METHOD route") inside an
// HTTP instrumentation's otherwise. The route is the pattern without its
// method (http.route's form), in the span and in the metrics. Attributes: http.request.method, http.route, idem.mode,
// http.response.status_code, idem.outcome (the terminal event: complete,
// replay, conflict, mismatch, release, fenced, store_error, rejected) and
// idem.claim (claim or takeover) when the handler ran. Never the key, the
// principal or a body: the events carry none. The ctx returned for
// EventBegin also carries OutboxPropagator, so that what the handler
// enqueues continues this span's trace.
func (i *Instrumentation) RequestHook() func(context.Context, idempotency.Event) context.Context {
	return func(ctx context.Context, e idempotency.Event) context.Context {
		e.Route = routeOf(e)
		switch e.Kind {
		case idempotency.EventBegin:
			kind, name := trace.SpanKindInternal, "idempotent "+e.Method+" "+e.Route
			if p := trace.SpanContextFromContext(ctx); !p.IsValid() || p.IsRemote() {
				kind, name = trace.SpanKindServer, e.Method+" "+e.Route
			}
			ctx, span := i.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(
				semconv.HTTPRequestMethodKey.String(e.Method), semconv.HTTPRoute(e.Route), AttrMode.String(e.Mode.String())))
			ctx = context.WithValue(ctx, requestSpanKey{}, span)
			return outbox.ContextWithPropagator(ctx, outboxPropagator{i.prop})
		case idempotency.EventPurge:
			if e.Purged > 0 {
				i.m.idemPurged.Add(ctx, int64(e.Purged), metric.WithAttributes(attribute.String("mode", e.Mode.String())))
			}
			return ctx
		}
		span, _ := ctx.Value(requestSpanKey{}).(trace.Span)
		route := i.m.routes.value(e.Route)
		labels := metric.WithAttributes(attribute.String("route", route), attribute.String("method", e.Method), attribute.String("mode", e.Mode.String()))
		switch e.Kind {
		case idempotency.EventClaim, idempotency.EventTakeover:
			if e.Kind == idempotency.EventTakeover {
				i.m.takeovers.Add(ctx, 1, labels)
			}
			if span != nil {
				span.SetAttributes(AttrClaim.String(string(e.Kind)))
			}
			return ctx
		case idempotency.EventLeaseLost:
			if span != nil {
				span.AddEvent("lease_lost")
			}
			return ctx
		case idempotency.EventReplay:
			i.m.replays.Add(ctx, 1, labels)
		case idempotency.EventConflict:
			i.m.conflicts.Add(ctx, 1, labels)
		case idempotency.EventMismatch:
			i.m.mismatches.Add(ctx, 1, labels)
		case idempotency.EventComplete, idempotency.EventRelease, idempotency.EventFenced,
			idempotency.EventStoreError, idempotency.EventRejected:
		default:
			return ctx // a kind this version does not know
		}
		i.m.requests.Add(ctx, 1, metric.WithAttributes(attribute.String("route", route), attribute.String("method", e.Method),
			attribute.String("mode", e.Mode.String()), attribute.String("outcome", string(e.Kind))))
		if span == nil {
			return ctx
		}
		span.SetAttributes(AttrOutcome.String(string(e.Kind)))
		if e.Status != 0 {
			span.SetAttributes(semconv.HTTPResponseStatusCode(e.Status))
		}
		switch {
		case e.Kind == idempotency.EventStoreError || e.Status >= 500:
			if e.Err != nil {
				span.RecordError(e.Err)
			}
			span.SetStatus(codes.Error, string(e.Kind))
		}
		span.End()
		return ctx
	}
}

// routeOf is the event's route as http.route spells it: a ServeMux
// pattern ("POST /orders/{id}/confirm") without its method.
func routeOf(e idempotency.Event) string {
	if m, rest, ok := strings.Cut(e.Route, " "); ok && m == e.Method {
		return rest
	}
	return e.Route
}
