package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/app"
	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	idemotel "github.com/idemkit/idem/otel"
	"github.com/idemkit/idem/paysim"
	"github.com/idemkit/idem/paysim/paysimtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// billing is app.Run in process, with every role, over a test schema, a
// kfake broker over TCP and paysim on loopback. Traced, app.Run gets
// Config.Telemetry and paysim's middleware is traced by the same
// Instrumentation, so that its spans land in the same recorder; else
// app.Run runs as billing serve does by default (no OTEL_* variables).
type billing struct {
	api   string
	db    *testdb.DB
	kc    *testkafka.Cluster
	spans *tracetest.SpanRecorder
	tp    *sdktrace.TracerProvider
	tel   *idemotel.Instrumentation
	// reader collects the OpenTelemetry metrics (traced runs set
	// Config.TelemetryMetrics).
	reader *sdkmetric.ManualReader
}

func startBilling(t *testing.T, traced bool) *billing {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	b := &billing{db: testdb.New(t), kc: testkafka.New(t), spans: sr, tp: tp, tel: tel, reader: reader}
	simCfg := &paysim.Config{Hook: tel.RequestHook(), Wrap: tel.Handler}
	telemetry := tel
	if !traced {
		simCfg, telemetry = nil, nil
	}
	_, simURL := paysimtest.Start(t, simCfg)
	pool, err := pgxpool.New(t.Context(), b.db.URL) // Run closes it
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, app.Config{
			Pool: pool, Brokers: b.kc.Addrs, PaymentURL: simURL, HTTPAddr: "127.0.0.1:0",
			Tokens: []httpapi.Token{{Secret: "alice-token", Principal: "alice"}}, ShutdownTimeout: 10 * time.Second,
			MetricsRefresh: 50 * time.Millisecond, Logger: quiet, Telemetry: telemetry, TelemetryMetrics: traced,
			OnListening: func(a net.Addr) { addr <- a },
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("app.Run: %v", err)
		}
	})
	select {
	case a := <-addr:
		b.api = "http://" + a.String()
	case err := <-done:
		done <- err
		t.Fatalf("app.Run ended before listening: %v", err)
	}
	b.waitFor(t, "/readyz answers 200", func() bool {
		resp, err := http.Get(b.api + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return b
}

// waitFor polls cond for at most a minute.
func (b *billing) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute; spans: %v", what, names(b.spans.Ended()))
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// post sends an authenticated POST with a key, under ctx's span (hc's
// transport writes its traceparent), and returns the status and the body.
func (b *billing) post(t *testing.T, ctx context.Context, hc *http.Client, path, key, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.api+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer alice-token")
	req.Header.Set(idem.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode >= 300 {
		t.Fatalf("POST %s: %d %v %v", path, resp.StatusCode, out, err)
	}
	return resp.StatusCode, out
}

// billing serve's wiring (app.Run with Config.Telemetry) makes the whole
// chain one trace: POST /orders and its confirm (children of the client's
// span, across HTTP), the orders consumer's record (child of the confirm,
// whose transaction enqueued the event: the trace context rode in the
// outbox row and the Kafka headers), the charge worker's record (child of
// the orders record, whose transaction enqueued the command), the
// idemclient attempt (child of that record) and paysim's request (child of
// the attempt, across HTTP). The relay's batches are traces of their own,
// linked to the traces of the events they carried. No span carries a key.
func TestOneTraceFromPOSTToCharge(t *testing.T) {
	b := startBilling(t, true)
	ctx, root := b.tp.Tracer("test").Start(t.Context(), "client")
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: b.tel.Transport(tr)}
	_, order := b.post(t, ctx, hc, "/orders", "create-key-1", `{"customer_id":"c1","total_kopecks":1500}`)
	id, _ := order["id"].(string)
	b.post(t, ctx, hc, "/orders/"+id+"/confirm", "confirm-key-1", ``)
	root.End()

	// The chain ends with paysim's span, then the charge worker's record;
	// the relay's batch that carried the command may end later still (it
	// marks its rows after the produce the worker already consumed).
	b.waitFor(t, "the chain's last spans", func() bool {
		spans := b.spans.Ended()
		rec := find(spans, "process "+usecase.TopicOrderEvents)
		if rec == nil || find(spans, "process "+usecase.TopicBillingCommands) == nil || find(spans, "POST /charges") == nil {
			return false
		}
		for _, s := range spans {
			for _, l := range s.Links() {
				if s.Name() == "publish" && l.SpanContext.SpanID() == rec.SpanContext().SpanID() {
					return true
				}
			}
		}
		return false
	})
	spans := b.spans.Ended()
	var status string
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT status FROM orders WHERE id = $1`, id).Scan(&status); err != nil || status != "CHARGED" {
		t.Fatalf("order %s: %q %v", id, status, err)
	}

	tid := root.SpanContext().TraceID()
	create := find(spans, "POST /orders")
	confirm := find(spans, "POST /orders/{id}/confirm")
	ordersRec := find(spans, "process "+usecase.TopicOrderEvents)
	chargeRec := find(spans, "process "+usecase.TopicBillingCommands)
	attempt := find(spans, "POST")
	charge := find(spans, "POST /charges")
	for _, x := range []struct {
		name          string
		span, parent  sdktrace.ReadOnlySpan
		kind          trace.SpanKind
		remoteParent  bool
		wantAttribute attribute.KeyValue
	}{
		{"POST /orders", create, nil, trace.SpanKindServer, true, attribute.String("idem.outcome", "complete")},
		{"confirm", confirm, nil, trace.SpanKindServer, true, attribute.String("http.route", "/orders/{id}/confirm")},
		{"orders record", ordersRec, confirm, trace.SpanKindConsumer, true, attribute.String("messaging.destination.name", usecase.TopicOrderEvents)},
		{"charge record", chargeRec, ordersRec, trace.SpanKindConsumer, true, attribute.Bool("idem.duplicate", false)},
		{"attempt", attempt, chargeRec, trace.SpanKindClient, false, attribute.Int("idem.attempt", 1)},
		{"paysim", charge, attempt, trace.SpanKindServer, true, attribute.String("idem.claim", "claim")},
	} {
		if x.span == nil {
			t.Fatalf("%s: no span; spans: %v", x.name, names(spans))
		}
		if x.span.SpanContext().TraceID() != tid {
			t.Errorf("%s: trace %s, want %s", x.name, x.span.SpanContext().TraceID(), tid)
		}
		wantParent := root.SpanContext().SpanID()
		if x.parent != nil {
			wantParent = x.parent.SpanContext().SpanID()
		}
		if x.span.Parent().SpanID() != wantParent || x.span.Parent().IsRemote() != x.remoteParent {
			t.Errorf("%s: parent %s (remote %v), want %s (remote %v)", x.name, x.span.Parent().SpanID(), x.span.Parent().IsRemote(), wantParent, x.remoteParent)
		}
		if x.span.SpanKind() != x.kind {
			t.Errorf("%s: kind %v, want %v", x.name, x.span.SpanKind(), x.kind)
		}
		if !hasAttr(x.span, x.wantAttribute) {
			t.Errorf("%s: lacks %v: %v", x.name, x.wantAttribute, x.span.Attributes())
		}
	}
	if !hasAttr(attempt, attribute.Bool("idem.replayed", false)) || !hasAttr(attempt, attribute.Int("http.response.status_code", 201)) ||
		!strings.HasSuffix(attrValue(attempt, "url.full"), "/charges") {
		t.Errorf("attempt attributes: %v", attempt.Attributes())
	}
	if !hasAttr(chargeRec, attribute.String("messaging.consumer.group.name", consumer.ChargeGroupDefault)) ||
		attrValue(chargeRec, "messaging.kafka.offset") == "" || attrValue(chargeRec, "messaging.destination.partition.id") == "" {
		t.Errorf("record attributes: %v", chargeRec.Attributes())
	}

	// The relay's batches: their own traces, linked to the events'.
	linked := map[trace.SpanID]bool{}
	for _, s := range spans {
		if s.Name() != "publish" {
			continue
		}
		if s.SpanContext().TraceID() == tid || s.Parent().IsValid() {
			t.Errorf("batch span %s is in the request's trace or has a parent", s.SpanContext().SpanID())
		}
		for _, l := range s.Links() {
			if l.SpanContext.TraceID() == tid {
				linked[l.SpanContext.SpanID()] = true
			}
		}
	}
	if !linked[confirm.SpanContext().SpanID()] || !linked[ordersRec.SpanContext().SpanID()] {
		t.Errorf("batch links %v lack the confirm (%s) or the orders record (%s)", linked, confirm.SpanContext().SpanID(), ordersRec.SpanContext().SpanID())
	}

	// The OpenTelemetry metrics of the same run: the instruments the hooks
	// feed, and the backlog gauge app.Run reads in the background.
	b.waitFor(t, "the OpenTelemetry outbox gauge", func() bool { return b.otelMetric(t, "idem.outbox.events") != nil })
	for _, name := range []string{"idem.idempotency.requests", "idem.outbox.published", "idem.consumer.records", "idem.client.attempts"} {
		if b.otelMetric(t, name) == nil {
			t.Errorf("no OpenTelemetry metric %s", name)
		}
	}

	// Never a request's key (nor the principal) in a span. (billing's
	// charge key is the command's event id, which messaging.message.id
	// carries by the conventions: an event id is no secret in idem's
	// hooks.)
	for _, s := range spans {
		for _, kv := range s.Attributes() {
			v := kv.Value.String()
			for _, secret := range []string{"create-key-1", "confirm-key-1", "alice"} {
				if strings.Contains(v, secret) {
					t.Errorf("span %s attribute %s = %q carries %q", s.Name(), kv.Key, v, secret)
				}
			}
		}
	}
}

// billing's /metrics serves idem's collector (package idemprom) beside
// billing's own metrics, fed by the hooks app.Run gives every component:
// the counters match what the test did (3 replays → 3, one dead letter →
// 1, one order through the chain), and billing's own names are still
// there. Tracing is off, as by default.
func TestMetricsServeIdemCollector(t *testing.T) {
	b := startBilling(t, false)
	hc := &http.Client{}
	_, order := b.post(t, t.Context(), hc, "/orders", "m-create", `{"customer_id":"c1","total_kopecks":700}`)
	id, _ := order["id"].(string)
	for range 3 {
		b.post(t, t.Context(), hc, "/orders", "m-create", `{"customer_id":"c1","total_kopecks":700}`)
	}
	b.post(t, t.Context(), hc, "/orders/"+id+"/confirm", "m-confirm", ``)

	// A record the orders consumer can never handle: dead-lettered once.
	prod := b.kc.Client(t)
	poison := &kgo.Record{Topic: usecase.TopicOrderEvents, Key: []byte("poison"), Value: []byte("{not json"),
		Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventType, Value: []byte(usecase.EventOrderConfirmed)}, {Key: kafka.HeaderEventID, Value: []byte("poison-1")}}}
	if err := prod.ProduceSync(t.Context(), poison).FirstErr(); err != nil {
		t.Fatal(err)
	}

	var fams map[string]*dto.MetricFamily
	ordersWant := map[string]string{"consumer": consumer.OrderGroup, "topic": usecase.TopicOrderEvents}
	b.waitFor(t, "the order charged and the poison record dead-lettered", func() bool {
		fams = scrape(t, b.api+"/metrics")
		dead, _ := value(fams, "idem_consumer_dead_letters_total", ordersWant)
		charged, _ := value(fams, "billing_charges_total", map[string]string{"target": "order", "outcome": "charged"})
		_, gauge := value(fams, "idem_outbox_events", nil)
		return dead >= 1 && charged >= 1 && gauge
	})
	for _, c := range []struct {
		name string
		want map[string]string
		n    float64
	}{
		{"idem_idempotency_replays_total", map[string]string{"route": "/orders", "method": "POST"}, 3},
		{"idem_idempotency_requests_total", map[string]string{"route": "/orders", "outcome": "replay"}, 3},
		{"idem_idempotency_requests_total", map[string]string{"route": "/orders", "outcome": "complete"}, 1},
		{"idem_idempotency_requests_total", map[string]string{"route": "/orders/{id}/confirm", "outcome": "complete"}, 1},
		{"idem_consumer_dead_letters_total", ordersWant, 1},
		{"idem_consumer_records_total", map[string]string{"consumer": consumer.OrderGroup, "outcome": "dead_lettered"}, 1},
		{"idem_consumer_records_total", map[string]string{"consumer": consumer.OrderGroup, "outcome": "processed"}, 1},
		{"idem_consumer_records_total", map[string]string{"consumer": consumer.ChargeGroupDefault, "outcome": "processed"}, 1},
		{"idem_outbox_published_total", map[string]string{"topic": usecase.TopicOrderEvents}, 1},
		{"idem_outbox_published_total", map[string]string{"topic": usecase.TopicBillingCommands}, 1},
		{"idem_client_attempts_total", map[string]string{"method": "POST", "outcome": "ok"}, 1},
		{"billing_idempotency_events_total", map[string]string{"kind": "replay"}, 3},
		{"billing_charges_total", map[string]string{"target": "order", "outcome": "charged"}, 1},
	} {
		got, found := value(fams, c.name, c.want)
		if !found || got != c.n {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.want, got, found, c.n)
		}
	}
	for _, name := range []string{"idem_outbox_publish_latency_seconds", "idem_outbox_batch_duration_seconds", "idem_consumer_commit_latency_seconds",
		"idem_outbox_oldest_pending_age_seconds", "billing_outbox_pending", "billing_http_requests_total"} {
		if _, found := value(fams, name, nil); !found {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// otelMetric collects the OpenTelemetry metrics and returns name's, or
// nil.
func (b *billing) otelMetric(t *testing.T, name string) *metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for i := range sm.Metrics {
			if sm.Metrics[i].Name == name {
				return &sm.Metrics[i]
			}
		}
	}
	return nil
}

// scrape GETs a /metrics over HTTP and parses it as Prometheus does.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value adds the samples of name whose labels include want (a
// histogram's sample count); found is false when the family is absent.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (v float64, found bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, x := range want {
			if labels[k] != x {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		case m.Histogram != nil:
			v += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return v, true
}

func find(spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, fmt.Sprintf("%s(%s)", s.Name(), s.SpanContext().TraceID()))
	}
	return out
}

func hasAttr(s sdktrace.ReadOnlySpan, want attribute.KeyValue) bool {
	for _, kv := range s.Attributes() {
		if kv.Key == want.Key && kv.Value == want.Value {
			return true
		}
	}
	return false
}

func attrValue(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}
