package httpapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

// fixture is billing's API over a fresh migrated schema, with its log
// captured.
type fixture struct {
	db  *testdb.DB
	h   http.Handler
	m   *httpapi.Metrics
	log *testbin.Buffer
}

const (
	aliceSecret = "alice-secret-0123456789"
	bobSecret   = "bob-secret-0123456789"
)

func setup(t *testing.T, opts ...testdb.Option) *fixture {
	t.Helper()
	return setupOn(t, postgres.LayerPGX, opts...)
}

// setupOn is setup on a data layer: postgres.LayerPGX (Config.DB) or
// postgres.LayerSQL (Config.SQLDB, pgx's stdlib driver).
func setupOn(t *testing.T, layer string, opts ...testdb.Option) *fixture {
	t.Helper()
	db := testdb.New(t, opts...)
	if err := postgres.Migrate(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	f := &fixture{db: db, m: httpapi.NewMetrics(), log: &testbin.Buffer{}}
	cfg := httpapi.Config{DB: db.Pool}
	if layer == postgres.LayerSQL {
		cfg = httpapi.Config{SQLDB: db.SQL(t, "pgx", 20)}
	}
	h, _, err := httpapi.NewHandler(httpapi.Config{
		DB:             cfg.DB,
		SQLDB:          cfg.SQLDB,
		Tokens:         []httpapi.Token{{Secret: aliceSecret, Principal: "alice"}, {Secret: bobSecret, Principal: "bob"}},
		Ready:          http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		Metrics:        f.m,
		MetricsHandler: f.m.Handler(httpapi.ScrapeConfig{Anonymous: true}),
		Logger:         slog.New(slog.NewTextHandler(f.log, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	return f
}

// forLayers runs test as a parallel subtest per data layer.
func forLayers(t *testing.T, test func(t *testing.T, layer string)) {
	for _, layer := range []string{postgres.LayerPGX, postgres.LayerSQL} {
		t.Run(layer, func(t *testing.T) {
			t.Parallel()
			test(t, layer)
		})
	}
}

// do sends one request as alice (key and body optional).
func (f *fixture) do(method, path, key, body string) *httptest.ResponseRecorder {
	return f.as(aliceSecret, method, path, key, body)
}

func (f *fixture) as(secret, method, path, key, body string) *httptest.ResponseRecorder {
	var r *http.Request
	if body != "" {
		r = httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
	} else {
		r = httptest.NewRequest(method, path, nil)
	}
	r.Header.Set("Authorization", "Bearer "+secret)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

// order creates a NEW order for customer c1 and returns its id.
func (f *fixture) order(t *testing.T, key string, total int64) string {
	t.Helper()
	w := f.do("POST", "/orders", key, `{"customer_id":"c1","total_kopecks":`+itoa(total)+`}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("create order: %d %s", w.Code, w.Body)
	}
	var o struct{ ID string }
	if err := json.Unmarshal(w.Body.Bytes(), &o); err != nil || o.ID == "" {
		t.Fatalf("create order: %s (%v)", w.Body, err)
	}
	return o.ID
}

func (f *fixture) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// problem checks w is a problem+json of status and code, and returns its
// detail.
func problem(t *testing.T, what string, w *httptest.ResponseRecorder, status int, code string) string {
	t.Helper()
	var p httpapi.Problem
	if w.Code != status || w.Header().Get("Content-Type") != "application/problem+json" || json.Unmarshal(w.Body.Bytes(), &p) != nil || p.Code != code {
		t.Errorf("%s: %d %s %.300s; want %d problem+json %s", what, w.Code, w.Header().Get("Content-Type"), w.Body, status, code)
	}
	return p.Detail
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// eventually polls cond until it holds, for at most 20 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
}
