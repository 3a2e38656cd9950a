package idemotel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/adapters/out/payment"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/paysim"
	"github.com/idemkit/idem/paysim/paysimtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// chain is billing's flow, assembled from its packages with the
// Instrumentation's hooks, as cmd/billing wires it: the HTTP API, the
// two-phase relay, the orders consumer, the charge worker and paysim.
type chain struct {
	api   string
	db    *testdb.DB
	stops []func(context.Context) error
}

func startChain(t *testing.T, b *bundle) *chain {
	t.Helper()
	ctx := t.Context()
	db := testdb.New(t)
	if err := postgres.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	kc := testkafka.New(t)
	for _, topic := range []string{usecase.TopicOrderEvents, usecase.TopicBillingCommands} {
		kc.CreateTopic(t, topic, 2)
	}
	c := &chain{db: db}
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for i := len(c.stops) - 1; i >= 0; i-- {
			if err := c.stops[i](stop); err != nil {
				t.Errorf("stop: %v", err)
			}
		}
	})
	start := func(s interface {
		Start(context.Context) error
		Stop(context.Context) error
	}) {
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		c.stops = append(c.stops, s.Stop)
	}

	// paysim continues the charge worker's trace: Wrap extracts, Hook spans.
	_, simURL := paysimtest.Start(t, &paysim.Config{Hook: b.tel.RequestHook(), Wrap: b.tel.Handler})

	// The API: extraction in front of billing's handler.
	h, _, err := httpapi.NewHandler(httpapi.Config{DB: db.Pool, Tokens: []httpapi.Token{{Secret: "alice-token", Principal: "alice"}},
		Ready: http.NotFoundHandler(), Metrics: httpapi.NewMetrics(), Logger: quiet, Hook: b.tel.RequestHook()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(b.tel.Handler(h))
	t.Cleanup(srv.Close)
	c.api = srv.URL

	prod := kc.Client(t, kafka.ProducerOpts()...)
	pub, err := kafka.NewPublisher(prod, nil)
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Mode: outbox.TwoPhase, PollInterval: 20 * time.Millisecond,
		Hook: b.tel.RelayHook(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	start(relay)

	// The orders consumer: billing's handler (consumer.NewOrderConsumer's),
	// with the hook.
	orders, err := kafka.NewConsumer(db.Pool, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		return usecase.HandleOrderConfirmed(ctx, postgres.New(tx), kafka.EventIDFromContext(ctx), rec.Value)
	}, &kafka.ConsumerConfig{Brokers: kc.Addrs, Group: consumer.OrderGroup, Topics: []string{usecase.TopicOrderEvents},
		Hook: b.tel.ConsumerHook(), Logger: quiet, ClientOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}})
	if err != nil {
		t.Fatal(err)
	}
	start(orders)

	// The charge worker: idemclient with the hook, over the propagating
	// transport.
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	ic, err := idemclient.New(&http.Client{Transport: b.tel.Transport(tr)}, &idemclient.Config{Hook: b.tel.ClientHook()})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := payment.NewWithClient(simURL, ic)
	if err != nil {
		t.Fatal(err)
	}
	w, err := consumer.NewChargeWorker(db.Pool, gw, &consumer.ChargeWorkerConfig{Brokers: kc.Addrs, Logger: quiet, Hook: b.tel.ConsumerHook(),
		ClientOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}})
	if err != nil {
		t.Fatal(err)
	}
	start(w)
	return c
}

// post sends an authenticated POST with a key, under ctx's span (the
// Transport writes its traceparent).
func (c *chain) post(t *testing.T, ctx context.Context, hc *http.Client, path, key, body string) map[string]any {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.api+path, strings.NewReader(body))
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
	return out
}

// The whole chain is one trace: POST /orders and its confirm (children of
// the client's span), the orders consumer's record (child of the confirm,
// whose transaction enqueued the event), the charge worker's record (child
// of the orders record, whose transaction enqueued the command), the
// idemclient attempt (child of that record) and paysim's request (child of
// the attempt, across HTTP). The relay's batches are traces of their own,
// each linked to the trace of the events it carried. No span carries a
// key.
func TestOneTraceFromPOSTToCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := startChain(t, b)
	ctx, root := b.tp.Tracer("test").Start(t.Context(), "client")
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: b.tel.Transport(tr)}
	order := c.post(t, ctx, hc, "/orders", "create-key-1", `{"customer_id":"c1","total_kopecks":1500}`)
	id, _ := order["id"].(string)
	c.post(t, ctx, hc, "/orders/"+id+"/confirm", "confirm-key-1", ``)
	root.End()

	// Wait for the last span of the chain: paysim's, then the charge
	// worker's record.
	var spans []sdktrace.ReadOnlySpan
	deadline := time.Now().Add(30 * time.Second)
	for {
		spans = b.spans.Ended()
		if find(spans, "process "+usecase.TopicBillingCommands) != nil && find(spans, "POST /charges") != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the chain did not finish; spans: %v", names(spans))
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	var status string
	if err := c.db.Pool.QueryRow(t.Context(), `SELECT status FROM orders WHERE id = $1`, id).Scan(&status); err != nil || status != "CHARGED" {
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
