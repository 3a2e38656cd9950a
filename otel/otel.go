package idemotel

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/outbox"
)

// ScopeName is the instrumentation scope of idem's tracer and meter.
const ScopeName = "github.com/idemkit/idem/otel"

// MessagingSystemDefault is Config.MessagingSystem's default.
const MessagingSystemDefault = "kafka"

// Config configures an Instrumentation. A nil Config means all defaults.
type Config struct {
	// TracerProvider makes the spans. Defaults to otel.GetTracerProvider()
	// at New.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments. Defaults to
	// otel.GetMeterProvider() at New.
	MeterProvider metric.MeterProvider
	// Propagator carries the trace context over HTTP (Handler extracts it,
	// Transport injects it) and in outbox event headers (EnqueueTx through
	// OutboxPropagator; ConsumerHook extracts it). Defaults to
	// propagation.TraceContext{}: W3C traceparent and tracestate only.
	// Baggage is not carried unless set here: a client's baggage would
	// otherwise ride along in every outbox row and broker message.
	Propagator propagation.TextMapPropagator
	// MessagingSystem is the messaging.system attribute of relay and
	// consumer spans ("kafka", "nats"). Defaults to MessagingSystemDefault
	// ("kafka").
	MessagingSystem string
}

// Instrumentation makes the hooks, the transport and the handler that
// trace and measure idem's components. It is safe for concurrent use; make
// one per process and give its hooks to every component.
type Instrumentation struct {
	tracer trace.Tracer
	meter  metric.Meter
	prop   propagation.TextMapPropagator
	system attribute.KeyValue
	m      *instruments
}

// New returns an Instrumentation; it creates the metric instruments once.
func New(cfg *Config) (*Instrumentation, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	if c.MessagingSystem == "" {
		c.MessagingSystem = MessagingSystemDefault
	}
	meter := c.MeterProvider.Meter(ScopeName)
	m, err := newInstruments(meter)
	if err != nil {
		return nil, errors.Join(errors.New("idemotel: metric instruments"), err)
	}
	return &Instrumentation{
		tracer: c.TracerProvider.Tracer(ScopeName),
		meter:  meter,
		prop:   c.Propagator,
		system: semconv.MessagingSystemKey.String(c.MessagingSystem),
		m:      m,
	}, nil
}

// OutboxPropagator is the Propagator that outbox.EnqueueTx uses through
// outbox.ContextWithPropagator: it writes the span context of the ctx
// given to EnqueueTx into the event's headers. The hooks that begin work
// (RequestHook, ConsumerHook) and Handler put it in their ctx already;
// code that enqueues from elsewhere wraps its ctx with WithPropagation.
func (i *Instrumentation) OutboxPropagator() outbox.Propagator { return outboxPropagator{i.prop} }

// WithPropagation returns ctx carrying OutboxPropagator, for an EnqueueTx
// called outside the work the hooks begin.
func (i *Instrumentation) WithPropagation(ctx context.Context) context.Context {
	return outbox.ContextWithPropagator(ctx, outboxPropagator{i.prop})
}

type outboxPropagator struct{ p propagation.TextMapPropagator }

func (o outboxPropagator) Inject(ctx context.Context, h map[string]string) {
	o.p.Inject(ctx, propagation.MapCarrier(h))
}

// Handler extracts the trace context of an incoming request (its
// traceparent header) into the request's ctx, so that the idempotency
// middleware's span (RequestHook) and everything the handler does are in
// the caller's trace, and puts OutboxPropagator in it, so that the events
// the handler enqueues carry that trace on. Put it in front of the
// idempotency middleware (paysim: Config.Wrap). It starts no span: an
// HTTP instrumentation such as otelhttp may wrap it for a server span.
func (i *Instrumentation) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := i.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx = outbox.ContextWithPropagator(ctx, outboxPropagator{i.prop})
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// Transport returns a RoundTripper that writes the trace context of each
// request's ctx into its headers (a copy: the request is not changed) and
// gives the ctx's span, when it is an attempt span of ClientHook, the
// HTTP client attributes (url.full without credentials or query,
// server.address, server.port). Give it to the http.Client that an
// idemclient.Client wraps: each attempt then continues its own client
// span on the server. A nil base means http.DefaultTransport.
func (i *Instrumentation) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{i: i, base: base}
}

type transport struct {
	i    *Instrumentation
	base http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if s, ok := ctx.Value(attemptSpanKey{}).(trace.Span); ok && s.IsRecording() {
		u := *req.URL
		u.User, u.RawQuery, u.ForceQuery, u.Fragment = nil, "", false, ""
		attrs := []attribute.KeyValue{semconv.URLFull(u.String()), semconv.ServerAddress(u.Hostname())}
		if p := u.Port(); p != "" {
			if n, err := parsePort(p); err == nil {
				attrs = append(attrs, semconv.ServerPort(n))
			}
		}
		s.SetAttributes(attrs...)
	}
	r := req.Clone(ctx) // RoundTrip must not change the caller's request
	t.i.prop.Inject(ctx, propagation.HeaderCarrier(r.Header))
	return t.base.RoundTrip(r)
}

// CloseIdleConnections forwards to the base transport, so that
// http.Client.CloseIdleConnections (idemclient's) still works.
func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func parsePort(p string) (int, error) {
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' || n > 65535 {
			return 0, errors.New("bad port")
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}

// extract returns the remote span context that headers carry, or an
// invalid one.
func (i *Instrumentation) extract(h propagation.TextMapCarrier) trace.SpanContext {
	return trace.SpanContextFromContext(i.prop.Extract(context.Background(), h))
}
