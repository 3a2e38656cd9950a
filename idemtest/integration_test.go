package idemtest_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/paysim"
	"github.com/idemkit/idem/paysim/paysimtest"
)

const chargeBody = `{"order_id":"o-1","customer_id":"c-1","amount_kopecks":1000}`

// TestPaysim runs the suite against the payment-provider simulator, counting
// executions through its ledger. paysim has no per-request fault switch and
// a fixed 24h retention, so those two checks skip; the rest must pass.
func TestPaysim(t *testing.T) {
	t.Parallel()
	// Latency widens the in-progress window so that racing requests meet
	// a claimed key and retry-after has something to judge.
	srv, url := paysimtest.Start(t, &paysim.Config{Latency: 200 * time.Millisecond})
	rep, err := idemtest.Run(t.Context(), idemtest.Target{
		URL:        url + "/charges",
		Body:       []byte(chargeBody),
		Header:     http.Header{"Authorization": {"Bearer alice"}},
		PrincipalB: http.Header{"Authorization": {"Bearer bob"}},
		Count:      func(context.Context) (int64, error) { return int64(srv.Ledger().Len()), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		t.Log(r)
	}
	// paysim has one route: routes skips too.
	wantSkip := []string{idemtest.CheckServerErrorReleased, idemtest.CheckExpiry, idemtest.CheckRoutes}
	failed := rep.Names(idemtest.Fail)
	if got := rep.Names(idemtest.Skip); !slices.Equal(got, wantSkip) || len(failed) > 0 {
		t.Fatalf("failed %v skipped %v, want none failed and %v skipped", failed, got, wantSkip)
	}
	if audit := paysim.Audit(srv.Ledger().Charges()); len(audit.DuplicateKeys) > 0 {
		t.Fatalf("ledger audit after the suite: %s", audit)
	}
}

// TestMiddlewareOverPostgres runs every check, as subtests, against a
// handler behind the idempotency middleware over the PostgreSQL store, in
// both modes. The handler writes one row per execution; the count is read
// back from the table, so "one execution" is a fact of the database.
func TestMiddlewareOverPostgres(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.ModeTwoStep, idempotency.ModeTransactional} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.MaxConns(16))
			if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE conformance_charge (id bigserial PRIMARY KEY, principal text NOT NULL, body jsonb NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			const retention = 2 * time.Second
			mw, err := idempotency.New(idempotency.NewPostgresStore(db.Pool), &idempotency.Config{
				Scope: func(r *http.Request) (string, error) {
					if a := r.Header.Get("Authorization"); a != "" {
						return a, nil
					}
					return "", errors.New("no credentials")
				},
				Mode:      mode,
				Retention: retention,
				Lease:     retention / 2, // a lease may not outlive the retention
			})
			if err != nil {
				t.Fatal(err)
			}
			var gate idemtest.Gate
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-Fault") != "" {
					http.Error(w, "injected fault", http.StatusInternalServerError)
					return
				}
				body, err := io.ReadAll(r.Body)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				q := `INSERT INTO conformance_charge (principal, body) VALUES ($1, $2) RETURNING id`
				var id int64
				if tx, ok := idempotency.TxFromContext(r.Context()); ok {
					err = tx.QueryRow(r.Context(), q, r.Header.Get("Authorization"), body).Scan(&id)
				} else {
					err = db.Pool.QueryRow(r.Context(), q, r.Header.Get("Authorization"), body).Scan(&id)
				}
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"id":`+strconv.FormatInt(id, 10)+`}`)
			})
			idemtest.Check(t, idemtest.Target{
				Handler:    mw.Wrap(gate.Wrap(app)),
				Path:       "/charges",
				AltPath:    "/refunds",
				Body:       []byte(chargeBody),
				Header:     http.Header{"Authorization": {"Bearer alice"}},
				PrincipalB: http.Header{"Authorization": {"Bearer bob"}},
				Count: func(ctx context.Context) (int64, error) {
					var n int64
					err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM conformance_charge`).Scan(&n)
					return n, err
				},
				Hold:        gate.Hold,
				FaultHeader: http.Header{"X-Fault": {"1"}},
				TTL:         retention,
			})
		})
	}
}
