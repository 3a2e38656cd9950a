package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	idemotel "github.com/idemkit/idem/otel"
	"github.com/idemkit/idem/paysim"
)

// consoleSpan is one line of the console exporter (stdouttrace): the
// fields the test reads.
type consoleSpan struct {
	Name        string
	SpanKind    int
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct {
		TraceID, SpanID string
		Remote          bool
	}
	Attributes []struct {
		Key   string
		Value struct{ Value any }
	}
	Links []struct {
		SpanContext struct{ TraceID, SpanID string }
	}
	Resource []struct {
		Key   string
		Value struct{ Value any }
	}
}

func (s consoleSpan) attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			b, _ := json.Marshal(a.Value.Value)
			return strings.Trim(string(b), `"`)
		}
	}
	return ""
}

// consoleSpans parses the JSON lines of stdout (other lines, "billing:
// listening on ...", are skipped).
func consoleSpans(t *testing.T, stdout string) []consoleSpan {
	t.Helper()
	var out []consoleSpan
	sc := bufio.NewScanner(strings.NewReader(stdout))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var s consoleSpan
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("stdout line %q: %v", line, err)
		}
		out = append(out, s)
	}
	return out
}

// TestConsoleTraceOneTraceID runs `OTEL_TRACES_EXPORTER=console billing
// serve` (the README's command) as a process against real PostgreSQL,
// kfake over TCP and paysim on loopback, sends POST /orders and its
// confirm with one client traceparent, and reads the spans billing prints
// on stdout (flushed by the SIGTERM stop). Every span of the request, the
// event and the command is in the client's trace, each the child of the
// one before: the API's two requests, the orders consumer's record (the
// trace context rode in the outbox row and the Kafka headers), the charge
// worker's record, the idemclient attempt; and paysim, traced here in the
// test process, got the attempt's traceparent over HTTP. The relay's batch
// spans are traces of their own linked to the events'.
func TestConsoleTraceOneTraceID(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, &paysim.Config{Hook: tel.RequestHook(), Wrap: tel.Handler})
	p := startServe(t, append(s.env, "OTEL_TRACES_EXPORTER=console", "OTEL_SERVICE_NAME=billing-under-test"))

	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	post := func(path, key, body string) map[string]any {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+p.Addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+traceID+"-"+clientSpan+"-01")
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
	id, _ := post("/orders", "trace-create", `{"customer_id":"c1","total_kopecks":1500}`)["id"].(string)
	post("/orders/"+id+"/confirm", "trace-confirm", ``)
	s.waitCount(t, 1, `SELECT count(*) FROM orders WHERE id = $1 AND status = 'CHARGED'`, id)
	deadline := time.Now().Add(time.Minute)
	for len(sr.Ended()) == 0 { // paysim's span ends as its answer is written
		if time.Now().After(deadline) {
			t.Fatal("paysim ended no span")
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("billing exited %d; stderr:\n%s", code, p.stderr.String())
	}
	spans := consoleSpans(t, p.stdout.String())
	find := func(name string) consoleSpan {
		t.Helper()
		for _, sp := range spans {
			if sp.Name == name {
				return sp
			}
		}
		var names []string
		for _, sp := range spans {
			names = append(names, sp.Name)
		}
		t.Fatalf("no span %q on stdout; spans: %v\nstdout:\n%s", name, names, p.stdout.String())
		return consoleSpan{}
	}
	create := find("POST /orders")
	confirm := find("POST /orders/{id}/confirm")
	ordersRec := find("process orders.events")
	chargeRec := find("process billing.commands")
	attempt := find("POST")
	for _, x := range []struct {
		name   string
		span   consoleSpan
		parent string
		remote bool
	}{
		{"POST /orders", create, clientSpan, true},
		{"confirm", confirm, clientSpan, true},
		{"orders record", ordersRec, confirm.SpanContext.SpanID, true},
		{"charge record", chargeRec, ordersRec.SpanContext.SpanID, true},
		{"attempt", attempt, chargeRec.SpanContext.SpanID, false},
	} {
		if x.span.SpanContext.TraceID != traceID {
			t.Errorf("%s: trace %s, want %s", x.name, x.span.SpanContext.TraceID, traceID)
		}
		if x.span.Parent.SpanID != x.parent || x.span.Parent.Remote != x.remote {
			t.Errorf("%s: parent %s (remote %v), want %s (remote %v)", x.name, x.span.Parent.SpanID, x.span.Parent.Remote, x.parent, x.remote)
		}
	}
	if create.attr("idem.outcome") != "complete" || ordersRec.attr("messaging.destination.name") != "orders.events" {
		t.Errorf("attributes: create %v, orders record %v", create.Attributes, ordersRec.Attributes)
	}
	service := ""
	for _, kv := range create.Resource {
		if kv.Key == "service.name" {
			service, _ = kv.Value.Value.(string)
		}
	}
	if service != "billing-under-test" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", service)
	}

	// The relay's batches: traces of their own, linked to the confirm's
	// and the orders record's spans.
	linked := map[string]bool{}
	for _, sp := range spans {
		if sp.Name != "publish" {
			continue
		}
		if sp.SpanContext.TraceID == traceID {
			t.Errorf("batch span %s is in the request's trace", sp.SpanContext.SpanID)
		}
		for _, l := range sp.Links {
			if l.SpanContext.TraceID == traceID {
				linked[l.SpanContext.SpanID] = true
			}
		}
	}
	if !linked[confirm.SpanContext.SpanID] || !linked[ordersRec.SpanContext.SpanID] {
		t.Errorf("batch links %v lack the confirm (%s) or the orders record (%s)", linked, confirm.SpanContext.SpanID, ordersRec.SpanContext.SpanID)
	}

	// paysim, across HTTP: its request span continues the attempt's.
	var charge sdktrace.ReadOnlySpan
	for _, sp := range sr.Ended() {
		if sp.Name() == "POST /charges" {
			charge = sp
		}
	}
	if charge == nil {
		t.Fatal("paysim has no POST /charges span")
	}
	if charge.SpanContext().TraceID().String() != traceID || charge.Parent().SpanID().String() != attempt.SpanContext.SpanID || !charge.Parent().IsRemote() {
		t.Errorf("paysim span: trace %s parent %s (remote %v); want trace %s, parent the attempt %s",
			charge.SpanContext().TraceID(), charge.Parent().SpanID(), charge.Parent().IsRemote(), traceID, attempt.SpanContext.SpanID)
	}
}

// Without OTEL_TRACES_EXPORTER, billing prints no span.
func TestNoExporterByDefault(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	p := startServe(t, s.env)
	createConfirm(t, newClient(p.Addr, aliceToken), 1)
	s.waitCount(t, 1, `SELECT count(*) FROM orders WHERE status = 'CHARGED'`)
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("billing exited %d; stderr:\n%s", code, p.stderr.String())
	}
	if spans := consoleSpans(t, p.stdout.String()); len(spans) != 0 {
		t.Fatalf("%d spans printed without OTEL_TRACES_EXPORTER: %+v", len(spans), spans[0])
	}
}
