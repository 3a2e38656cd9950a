package idemotel

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/idemclient"
)

type attemptSpanKey struct{}

// ClientHook is idemclient.Config.Hook: a client span per attempt and the
// client metrics. Give the wrapped http.Client the Transport, so that
// each attempt's span context reaches the server (and the span its URL
// attributes).
//
// The span (kind client, named after the method, as the HTTP conventions
// name client spans) starts at EventAttemptBegin as a child of the call's
// ctx and ends at the attempt's EventAttempt. Attributes:
// http.request.method, idem.attempt and http.request.resend_count
// (attempt − 1), http.response.status_code, idem.retry_reason for a failed
// attempt, idem.replayed, and url.full, server.address and server.port
// from the Transport. A 4xx or 5xx answer and a transport error are the
// span's error, as the HTTP client conventions say. The key is never an
// attribute.
func (i *Instrumentation) ClientHook() func(context.Context, idemclient.Event) context.Context {
	return func(ctx context.Context, e idemclient.Event) context.Context {
		switch e.Kind {
		case idemclient.EventAttemptBegin:
			ctx, span := i.tracer.Start(ctx, e.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
				semconv.HTTPRequestMethodKey.String(e.Method), AttrAttempt.Int(e.Attempt), semconv.HTTPRequestResendCount(e.Attempt-1)))
			return context.WithValue(ctx, attemptSpanKey{}, span)
		case idemclient.EventAttempt:
			outcome := "ok"
			if e.Reason != "" {
				outcome = string(e.Reason)
			}
			i.m.attempts.Add(ctx, 1, metric.WithAttributes(attribute.String("method", e.Method), attribute.String("outcome", outcome)))
			span, ok := ctx.Value(attemptSpanKey{}).(trace.Span)
			if !ok {
				return ctx
			}
			span.SetAttributes(AttrReplayed.Bool(e.Replayed))
			if e.Status != 0 {
				span.SetAttributes(semconv.HTTPResponseStatusCode(e.Status))
			}
			if e.Reason != "" {
				span.SetAttributes(AttrRetryReason.String(string(e.Reason)))
			}
			switch {
			case e.Status >= 400:
				span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(e.Status)))
				span.SetStatus(codes.Error, strconv.Itoa(e.Status))
			case e.Err != nil:
				span.RecordError(e.Err)
				span.SetAttributes(semconv.ErrorTypeKey.String(string(e.Reason)))
				span.SetStatus(codes.Error, string(e.Reason))
			}
			span.End()
		case idemclient.EventRetry:
			i.m.clientRetries.Add(ctx, 1, metric.WithAttributes(attribute.String("method", e.Method), attribute.String("reason", string(e.Reason))))
		}
		return ctx
	}
}
