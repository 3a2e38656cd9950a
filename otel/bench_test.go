package idemotel_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
	idemotel "github.com/idemkit/idem/otel"
)

// BenchmarkMiddlewareTracing is the idempotency middleware's cost with
// tracing and metrics on against off, in the same run: each iteration
// sends one new-key POST (claim, handler, complete: two round trips to
// PostgreSQL) to a server without hooks and one to a server with
// RequestHook, Handler and a client Transport, over real HTTP, both on one
// database, alternating so that both sides see the same load. The spans
// go through the SDK's batch processor to a discarding exporter, every
// span sampled. It reports each side's time per request and on/off, the
// throughput with tracing as a share of the throughput without (the goal
// is ≥ 0.9):
//
//	cd otel && go test -run '^$' -bench MiddlewareTracing -benchtime 2000x .
func BenchmarkMiddlewareTracing(b *testing.B) {
	db := testdb.New(b)
	store := idempotency.NewPostgresStore(db.Pool)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"1"}`)
	})
	server := func(hook func(context.Context, idempotency.Event) context.Context, wrap func(http.Handler) http.Handler) (*httptest.Server, *http.Client) {
		mw, err := idempotency.New(store, &idempotency.Config{Scope: func(*http.Request) (string, error) { return "bench", nil }, Hook: hook})
		if err != nil {
			b.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("POST /things", mw.Wrap(handler))
		var h http.Handler = mux
		if wrap != nil {
			h = wrap(h)
		}
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		return srv, srv.Client()
	}
	offSrv, offClient := server(nil, nil)
	onSrv, onClient := server(tel.RequestHook(), tel.Handler)
	onClient.Transport = tel.Transport(onClient.Transport)
	tracer := tp.Tracer("bench")
	run := b.Name()
	send := func(ctx context.Context, hc *http.Client, url, key string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/things", strings.NewReader(`{"n":1}`))
		req.Header.Set(idem.HeaderKey, key)
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	var off, on time.Duration
	b.ResetTimer()
	for i := range b.N {
		key := fmt.Sprintf("%s-%d", run, i)
		t0 := time.Now()
		send(context.Background(), offClient, offSrv.URL, "off-"+key)
		t1 := time.Now()
		ctx, span := tracer.Start(context.Background(), "client")
		send(ctx, onClient, onSrv.URL, "on-"+key)
		span.End()
		on += time.Since(t1)
		off += t1.Sub(t0)
	}
	b.StopTimer()
	b.ReportMetric(float64(off.Nanoseconds())/float64(b.N), "off-ns/req")
	b.ReportMetric(float64(on.Nanoseconds())/float64(b.N), "on-ns/req")
	b.ReportMetric(float64(off)/float64(on), "on/off")
}
