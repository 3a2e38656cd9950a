package app

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/adapters/out/payment"
	"github.com/idemkit/idem/examples/billing/scheduler"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/lifecycle"
	idemotel "github.com/idemkit/idem/otel"
	"github.com/idemkit/idem/outbox"
	idemprom "github.com/idemkit/idem/prom"
)

// telemetry gives every component its hooks: idem's Prometheus collector
// (package idemprom, always: billing's /metrics serves it beside billing's
// own metrics) and, when Config.Telemetry is set, the OpenTelemetry
// instrumentation (spans, OpenTelemetry metrics, the trace context over
// HTTP and through the outbox). Each component gets one joined hook: there
// is no second path.
type telemetry struct {
	tel  *idemotel.Instrumentation // nil: no tracing
	prom *idemprom.Metrics
	// debug, when set, logs every consumer event at Debug level (billing
	// serve with BILLING_LOG_LEVEL=debug): a stalled group's history.
	debug *slog.Logger
}

func newTelemetry(tel *idemotel.Instrumentation, m *httpapi.Metrics) (*telemetry, error) {
	pm, err := idemprom.New(m.Registry())
	if err != nil {
		return nil, err
	}
	return &telemetry{tel: tel, prom: pm}, nil
}

// request is the idempotency middleware's hook (httpapi.Config.Hook).
func (t *telemetry) request() func(context.Context, idempotency.Event) context.Context {
	if t.tel == nil {
		return t.prom.RequestHook()
	}
	return idem.JoinHooks(t.tel.RequestHook(), t.prom.RequestHook())
}

// consumer is a consumer's hook, joined after extra (billing's own
// counters).
func (t *telemetry) consumer(extra func(context.Context, kafka.ConsumerEvent) context.Context) func(context.Context, kafka.ConsumerEvent) context.Context {
	if t.debug != nil {
		extra = idem.JoinHooks(debugConsumerHook(t.debug), extra)
	}
	if t.tel == nil {
		return idem.JoinHooks(extra, t.prom.ConsumerHook())
	}
	return idem.JoinHooks(t.tel.ConsumerHook(), extra, t.prom.ConsumerHook())
}

// debugConsumerHook logs each consumer event at Debug level.
func debugConsumerHook(log *slog.Logger) func(context.Context, kafka.ConsumerEvent) context.Context {
	return func(ctx context.Context, e kafka.ConsumerEvent) context.Context {
		attrs := []any{"kind", e.Kind, "consumer", e.ConsumerID, "records", e.Records}
		if e.Message != nil {
			attrs = append(attrs, "stream", e.Message.Stream, "offset", e.Offset, "event_id", e.EventID, "delivery", e.Delivery)
		}
		if e.Attempt > 0 {
			attrs = append(attrs, "attempt", e.Attempt)
		}
		if e.Wait > 0 {
			attrs = append(attrs, "wait", e.Wait)
		}
		if e.Duration > 0 {
			attrs = append(attrs, "duration", e.Duration)
		}
		if e.Stuck {
			attrs = append(attrs, "stuck", true)
		}
		if e.Err != nil {
			attrs = append(attrs, "err", e.Err)
		}
		log.DebugContext(ctx, "consumer event", attrs...)
		return ctx
	}
}

// loops are the relay's and the inbox purger's hooks.
func (t *telemetry) loops() scheduler.Hooks {
	if t.tel == nil {
		return scheduler.Hooks{Relay: t.prom.RelayHook(), InboxPurge: t.prom.InboxPurgeHook()}
	}
	return scheduler.Hooks{
		Relay:      idem.JoinHooks(t.tel.RelayHook(), t.prom.RelayHook()),
		InboxPurge: idem.JoinHooks(t.tel.InboxPurgeHook(), t.prom.InboxPurgeHook()),
	}
}

// handler puts the caller's trace context (traceparent) into each API
// request's ctx, in front of billing's handler, so that the middleware's
// span and the events the request enqueues are in the caller's trace.
func (t *telemetry) handler(h http.Handler) http.Handler {
	if t.tel == nil {
		return h
	}
	return t.tel.Handler(h)
}

// gateway is the payment provider's client: idemclient with the client
// hooks, over a transport that writes each attempt's trace context into
// its request, so that the provider continues the trace.
func (t *telemetry) gateway(url string, attemptTimeout time.Duration) (*payment.Gateway, error) {
	hc := &http.Client{Timeout: attemptTimeout}
	hook := t.prom.ClientHook()
	if t.tel != nil {
		hc.Transport = t.tel.Transport(nil)
		hook = idem.JoinHooks(t.tel.ClientHook(), hook)
	}
	ic, err := idemclient.New(hc, &idemclient.Config{Hook: hook})
	if err != nil {
		return nil, err
	}
	return payment.NewWithClient(url, ic)
}

// gauges are the outbox backlog readers of idem's metrics (the
// collector's and, with OpenTelemetry metrics on, the instrumentation's),
// each reading in the background every interval.
func (t *telemetry) gauges(db outbox.DBTX, interval time.Duration, otelMetrics bool) ([]lifecycle.Component, error) {
	pg, err := t.prom.OutboxGauges(db, &idemprom.OutboxGaugesConfig{Interval: interval})
	if err != nil {
		return nil, err
	}
	out := []lifecycle.Component{pg}
	if t.tel != nil && otelMetrics {
		og, err := t.tel.OutboxGauges(db, &idemotel.OutboxGaugesConfig{Interval: interval})
		if err != nil {
			return nil, err
		}
		out = append(out, og)
	}
	return out, nil
}
