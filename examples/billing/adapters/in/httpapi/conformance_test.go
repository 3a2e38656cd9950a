package httpapi_test

import (
	"context"
	"net/http"
	"slices"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testdb"
)

// TestBillingHTTP runs the suite against the reference service's HTTP API
// (POST /orders, transactional mode, bearer-token principals) on real
// PostgreSQL, counting executions in its orders table. Billing has no fault
// switch, no Gate and a 24h retention: server-error-released and expiry
// skip, and retry-after passes or skips depending on whether a racing
// request meets the open claim; nothing may fail. The routes check sends
// the order's key to POST /payments too, whose answer (the order there
// does not exist) must be its own.
//
// It runs on both data layers: pgx (Config.DB) and database/sql on pgx's
// stdlib driver (Config.SQLDB: NewSQLStore, SQLTxFromContext).
func TestBillingHTTP(t *testing.T) {
	t.Parallel()
	for _, layer := range []string{postgres.LayerPGX, postgres.LayerSQL} {
		t.Run(layer, func(t *testing.T) {
			t.Parallel()
			billingHTTP(t, layer)
		})
	}
}

func billingHTTP(t *testing.T, layer string) {
	db := testdb.New(t, testdb.MaxConns(16))
	if err := postgres.Migrate(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	cfg := httpapi.Config{DB: db.Pool}
	if layer == postgres.LayerSQL {
		cfg = httpapi.Config{SQLDB: db.SQL(t, "pgx", 16)}
	}
	h, _, err := httpapi.NewHandler(httpapi.Config{
		DB:      cfg.DB,
		SQLDB:   cfg.SQLDB,
		Tokens:  []httpapi.Token{{Secret: "alice-token", Principal: "alice"}, {Secret: "bob-token", Principal: "bob"}},
		Ready:   http.NotFoundHandler(),
		Metrics: httpapi.NewMetrics(),
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := idemtest.Run(t.Context(), idemtest.Target{
		Handler:    h,
		Path:       "/orders",
		Body:       []byte(`{"customer_id":"c1","total_kopecks":1000}`),
		AltPath:    "/payments",
		AltURLBody: []byte(`{"order_id":"ord_none","customer_id":"c1","amount_kopecks":500}`),
		Header:     http.Header{"Authorization": {"Bearer alice-token"}},
		PrincipalB: http.Header{"Authorization": {"Bearer bob-token"}},
		Count: func(ctx context.Context) (int64, error) {
			var n int64
			err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return n, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		t.Log(r)
	}
	skipped := slices.DeleteFunc(rep.Names(idemtest.Skip), func(n string) bool { return n == idemtest.CheckRetryAfter })
	if want := []string{idemtest.CheckServerErrorReleased, idemtest.CheckExpiry}; rep.Failed() || !slices.Equal(skipped, want) {
		t.Fatalf("failed %v skipped %v, want none failed and %v skipped", rep.Names(idemtest.Fail), rep.Names(idemtest.Skip), want)
	}
}
