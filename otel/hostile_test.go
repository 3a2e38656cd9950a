package idemotel_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/outbox"
)

// A Route that falls back to the raw path (idempotency's default for a
// request without a pattern) cannot make a series per path: past 100
// routes the label is "other". A hostile traceparent is ignored (a new
// trace), and one that parses only continues a trace: it reaches no
// header EnqueueTx would store beyond the propagator's own.
func TestHostileRoutesAndTraceparents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{
		Scope: func(*http.Request) (string, error) { return "p", nil }, Hook: b.tel.RequestHook()})
	if err != nil {
		t.Fatal(err)
	}
	var enqueued []map[string]string
	h := b.tel.Handler(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enqueued = append(enqueued, outbox.InjectHeaders(r.Context(), nil))
		w.WriteHeader(http.StatusCreated)
	})))
	srv := httptest.NewServer(h) // no pattern: Route is the raw path
	t.Cleanup(srv.Close)
	hostile := []string{"", "00-zz", strings.Repeat("f", 10000), "00-00000000000000000000000000000000-0000000000000000-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	for i := range 150 {
		req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/things/%d", srv.URL, i), strings.NewReader("{}"))
		req.Header.Set(idem.HeaderKey, fmt.Sprintf("k-%d", i))
		req.Header.Set("traceparent", hostile[i%len(hostile)])
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	routes := map[string]bool{}
	sumData := b.metrics(t)["idem.idempotency.requests"].Data.(metricdata.Sum[int64])
	for _, p := range sumData.DataPoints {
		v, _ := p.Attributes.Value("route")
		routes[v.AsString()] = true
	}
	if len(routes) > 101 || !routes["other"] {
		t.Fatalf("%d route label values (other present: %v), want at most 100 plus other", len(routes), routes["other"])
	}
	for i, hdr := range enqueued {
		if len(hdr) != 1 || len(hdr["traceparent"]) != 55 {
			t.Fatalf("request %d: enqueue headers %v, want one fresh traceparent", i, hdr)
		}
		if i%len(hostile) == len(hostile)-1 && !strings.Contains(hdr["traceparent"], "0af7651916cd43dd8448eb211c80319c") {
			t.Fatalf("request %d: the valid traceparent was not continued: %v", i, hdr)
		}
	}
}
