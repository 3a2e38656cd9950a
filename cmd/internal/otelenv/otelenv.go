// Package otelenv sets OpenTelemetry up for idem's commands (billing
// serve, idem paysim) from the standard OTEL_* environment variables, by
// the contrib autoexport convention, and gives the commands an
// idemotel.Instrumentation over it.
//
//   - OTEL_TRACES_EXPORTER: otlp, console (one JSON span a line on
//     stdout) or none. Unset: none, unlike autoexport's own default (otlp):
//     a command started without any OTEL_* variable exports nothing and
//     dials nothing.
//   - OTEL_METRICS_EXPORTER: otlp, console, prometheus or none; unset:
//     none, likewise.
//   - The exporters' own variables (OTEL_EXPORTER_OTLP_ENDPOINT,
//     OTEL_EXPORTER_OTLP_PROTOCOL, ...) and the resource's
//     (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) as the SDK reads them.
//
// The trace context travels as W3C traceparent/tracestate
// (idemotel.Config.Propagator's default); OTEL_PROPAGATORS is not read.
package otelenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	idemotel "github.com/idemkit/idem/otel"
)

// Environment variables read here (the exporters read their own).
const (
	EnvTraces  = "OTEL_TRACES_EXPORTER"
	EnvMetrics = "OTEL_METRICS_EXPORTER"
)

// ErrBadEnv is an OTEL_* value the exporters refuse; the command exits 2.
var ErrBadEnv = errors.New("otelenv: bad OpenTelemetry environment")

// FlushTimeoutDefault bounds Setup.Shutdown's flush of what the
// exporters still buffer: short, since it follows a stop already bounded
// by SHUTDOWN_TIMEOUT (25s by default, below a 30s grace period), and an
// unreachable OTLP collector would otherwise hold the exit.
const FlushTimeoutDefault = 2 * time.Second

// Setup is what FromEnv made.
type Setup struct {
	// Tel is the instrumentation for the components' hooks; nil when
	// neither traces nor metrics are exported.
	Tel *idemotel.Instrumentation
	// Traces and Metrics tell which signals are exported.
	Traces, Metrics bool

	shutdown []func(context.Context) error
}

// FromEnv reads the OTEL_* variables and starts the exporters they name;
// service is the default service.name (OTEL_SERVICE_NAME wins). A value
// the exporters refuse is ErrBadEnv.
func FromEnv(ctx context.Context, service string) (*Setup, error) {
	s := &Setup{}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("%w: resource: %v", ErrBadEnv, err)
	}
	var tp trace.TracerProvider
	if os.Getenv(EnvTraces) != "" {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w: %s=%q: %v", ErrBadEnv, EnvTraces, os.Getenv(EnvTraces), err)
		}
		if !autoexport.IsNoneSpanExporter(exp) {
			p := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
			tp, s.Traces = p, true
			s.shutdown = append(s.shutdown, p.Shutdown)
		}
	}
	var mp metric.MeterProvider
	if os.Getenv(EnvMetrics) != "" {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			_ = s.Shutdown(ctx)
			return nil, fmt.Errorf("%w: %s=%q: %v", ErrBadEnv, EnvMetrics, os.Getenv(EnvMetrics), err)
		}
		if !autoexport.IsNoneMetricReader(r) {
			p := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r), sdkmetric.WithResource(res))
			mp, s.Metrics = p, true
			s.shutdown = append(s.shutdown, p.Shutdown)
		}
	}
	if !s.Traces && !s.Metrics {
		return s, nil
	}
	cfg := &idemotel.Config{TracerProvider: tp, MeterProvider: mp}
	if tp == nil {
		cfg.TracerProvider = tracenoop.NewTracerProvider()
	}
	if mp == nil {
		cfg.MeterProvider = metricnoop.NewMeterProvider()
	}
	if s.Tel, err = idemotel.New(cfg); err != nil {
		_ = s.Shutdown(ctx)
		return nil, err
	}
	return s, nil
}

// Shutdown flushes what the exporters still buffer and stops them,
// bounded by ctx and FlushTimeoutDefault. Spans of a process killed
// (SIGKILL) before it are lost.
func (s *Setup) Shutdown(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, FlushTimeoutDefault)
	defer cancel()
	var errs []error
	for i := len(s.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, s.shutdown[i](ctx))
	}
	s.shutdown = nil
	return errors.Join(errs...)
}
