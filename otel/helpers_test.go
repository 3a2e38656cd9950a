package idemotel_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	idemotel "github.com/idemkit/idem/otel"
)

// bundle is an Instrumentation over an in-memory span recorder and a
// manual metric reader.
type bundle struct {
	tel    *idemotel.Instrumentation
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
}

func setup(t *testing.T) *bundle {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{tel: tel, spans: sr, tp: tp, reader: reader}
}

// metrics collects every metric by name.
func (b *bundle) metrics(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// match reports whether set has every attribute of want.
func match(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		got, ok := set.Value(attribute.Key(k))
		if !ok || got.String() != v {
			return false
		}
	}
	return true
}

// sum adds the data points of a counter or gauge (or the counts of a
// histogram) whose attributes include want; found is false when the
// metric is absent.
func sum(ms map[string]metricdata.Metrics, name string, want map[string]string) (v float64, found bool) {
	m, ok := ms[name]
	if !ok {
		return 0, false
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes, want) {
				v += float64(p.Value)
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes, want) {
				v += float64(p.Value)
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes, want) {
				v += p.Value
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes, want) {
				v += float64(p.Count)
			}
		}
	}
	return v, true
}

// tableNames are the OpenTelemetry names of docs/metrics.md's table.
func tableNames(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`idem.") {
			continue
		}
		out = append(out, strings.Trim(strings.TrimSpace(cells[1]), "`"))
	}
	if len(out) == 0 {
		t.Fatal("docs/metrics.md has no table")
	}
	return out
}
