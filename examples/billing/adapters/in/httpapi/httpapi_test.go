package httpapi_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseTokens(t *testing.T) {
	t.Parallel()
	got, err := httpapi.ParseTokens("t1:alice, t2:bob")
	if err != nil || len(got) != 2 || got[1] != (httpapi.Token{Secret: "t2", Principal: "bob"}) {
		t.Fatalf("%+v %v", got, err)
	}
	for _, bad := range []string{"", "t1", "t1:", ":alice", "t1:alice,,t2:bob", "t1:alice,t1:bob", "t1:alice,t1:alice"} {
		_, err := httpapi.ParseTokens(bad)
		if !errors.Is(err, httpapi.ErrBadTokens) {
			t.Errorf("%q: %v", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "t1") {
			t.Errorf("%q: the error shows the secret: %v", bad, err)
		}
	}
	if _, err := httpapi.ParseTokens(httpapi.DefaultTokens); err != nil {
		t.Fatal(err)
	}
}

func FuzzParseTokens(f *testing.F) {
	f.Add("a:b,c:d")
	f.Add(":")
	f.Fuzz(func(t *testing.T, s string) {
		toks, err := httpapi.ParseTokens(s)
		if err != nil {
			return
		}
		for _, tok := range toks {
			if tok.Secret == "" || tok.Principal == "" {
				t.Fatalf("accepted an empty half in %q", s)
			}
		}
	})
}

// TestPOSTCommitsWithTheIdempotencyRecord proves the transactional wiring
// in process: a POST's order row, its idempotency record and its metrics
// are there, a replay returns the same body without a second row, and a
// POST whose handler fails validation writes no order.
func TestPOSTCommitsWithTheIdempotencyRecord(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if err := postgres.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	m := httpapi.NewMetrics()
	h, _, err := httpapi.NewHandler(httpapi.Config{DB: db.Pool, Tokens: []httpapi.Token{{Secret: "s", Principal: "alice"}}, Ready: http.NotFoundHandler(), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	do := func(key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer s")
		r.Header.Set("Idempotency-Key", key)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first := do("k1", `{"customer_id":"c1","total_kopecks":10}`)
	again := do("k1", `{"customer_id":"c1","total_kopecks":10}`)
	if first.Code != 201 || again.Code != 201 || first.Body.String() != again.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s; again %d %s %v", first.Code, first.Body, again.Code, again.Body, again.Header())
	}
	if bad := do("k2", `{"customer_id":"c1","total_kopecks":0}`); bad.Code != 422 {
		t.Fatalf("zero total: %d %s", bad.Code, bad.Body)
	}
	// A validation failure is not stored (idempotency.DoNotStore): only
	// k1's record exists.
	var orders, keys int
	_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders)
	_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_key`).Scan(&keys)
	if orders != 1 || keys != 1 {
		t.Fatalf("%d orders and %d idempotency records, want 1 and 1", orders, keys)
	}
	w := httptest.NewRecorder()
	m.Handler(httpapi.ScrapeConfig{Anonymous: true}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(w.Body)
	for _, want := range []string{
		`billing_http_requests_total{method="POST",route="POST /orders",status="201"} 2`,
		`billing_http_requests_total{method="POST",route="POST /orders",status="422"} 1`,
		`billing_idempotency_events_total{kind="replay"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
