package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/outbox"
)

// countingDB is the real pool, counting the statements sent through it.
type countingDB struct {
	outbox.DBTX
	n atomic.Int64
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n.Add(1)
	return c.DBTX.Exec(ctx, sql, args...)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n.Add(1)
	return c.DBTX.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.DBTX.QueryRow(ctx, sql, args...)
}

func scrape(h http.Handler, auth string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/metrics", nil)
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestScrapesNeverQuery: the outbox gauges come from the background
// refresh; 64 scrapes, 16 at a time, send no statement to the database
// (on main each scrape counted outbox_event on the API's pool), and a
// scrape shows what the last refresh saw until the next one.
func TestScrapesNeverQuery(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := httpapi.NewMetrics()
	db := &countingDB{DBTX: f.db.Pool}
	g := m.NewGauges(httpapi.GaugesConfig{DB: db})
	h := m.Handler(httpapi.ScrapeConfig{Anonymous: true, MaxInFlight: 64})
	if w := scrape(h, ""); strings.Contains(w.Body.String(), "billing_outbox_pending") {
		t.Fatal("an outbox gauge before the first refresh")
	}
	g.Refresh(t.Context())
	after := db.n.Load()
	if after == 0 {
		t.Fatal("the refresh sent no statement")
	}
	if err := pgx.BeginFunc(t.Context(), f.db.Pool, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueTx(t.Context(), tx, outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "1", EventType: "E", Payload: []byte(`{}`)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				if w := scrape(h, ""); w.Code != 200 || !strings.Contains(w.Body.String(), "billing_outbox_pending 0\n") {
					t.Errorf("scrape: %d, pending not 0 (the stale value)", w.Code)
				}
			}
		}()
	}
	wg.Wait()
	if n := db.n.Load(); n != after {
		t.Fatalf("64 scrapes sent %d statements, want none", n-after)
	}
	g.Refresh(t.Context())
	w := scrape(h, "")
	for _, want := range []string{"billing_outbox_pending 1\n", "billing_outbox_dead 0\n", `billing_gauges_refreshed_timestamp_seconds{source="outbox"}`} {
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("after a refresh /metrics lacks %q", want)
		}
	}
}

// TestGaugesRunRefreshesUntilStopped: Run refreshes at once and returns
// when its context ends.
func TestGaugesRunRefreshesUntilStopped(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := httpapi.NewMetrics()
	db := &countingDB{DBTX: f.db.Pool}
	g := m.NewGauges(httpapi.GaugesConfig{DB: db})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	h := m.Handler(httpapi.ScrapeConfig{Anonymous: true})
	eventually(t, "the first refresh", func() bool { return strings.Contains(scrape(h, "").Body.String(), "billing_outbox_pending 0") })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestMetricsAccess: without a token /metrics is refused unless anonymous
// access was granted (a loopback listener); with one, only its bearer is
// served.
func TestMetricsAccess(t *testing.T) {
	t.Parallel()
	m := httpapi.NewMetrics()
	for _, tt := range []struct {
		name string
		cfg  httpapi.ScrapeConfig
		auth string
		want int
	}{
		{"no token, not anonymous", httpapi.ScrapeConfig{}, "", 401},
		{"no token, not anonymous, any bearer", httpapi.ScrapeConfig{}, "Bearer x", 401},
		{"anonymous", httpapi.ScrapeConfig{Anonymous: true}, "", 200},
		{"token, none sent", httpapi.ScrapeConfig{Token: "metrics-secret"}, "", 401},
		{"token, wrong one", httpapi.ScrapeConfig{Token: "metrics-secret"}, "Bearer metrics-secreT", 401},
		{"token, anonymous does not bypass it", httpapi.ScrapeConfig{Token: "metrics-secret", Anonymous: true}, "", 401},
		{"token", httpapi.ScrapeConfig{Token: "metrics-secret"}, "Bearer metrics-secret", 200},
	} {
		w := scrape(m.Handler(tt.cfg), tt.auth)
		if w.Code != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, w.Code, tt.want)
		}
		if w.Code == 401 && w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: 401 is not problem+json", tt.name)
		}
	}
}
