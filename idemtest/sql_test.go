package idemtest_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testdb"
)

// TestMiddlewareOverSQL is TestMiddlewareOverPostgres on database/sql:
// every check against a handler behind the middleware over NewSQLStore,
// in both modes, on lib/pq and on pgx's stdlib. In ModeTransactional the
// handler writes its row through SQLTxFromContext; the executions are
// counted in the table.
func TestMiddlewareOverSQL(t *testing.T) {
	t.Parallel()
	for _, driver := range testdb.SQLDrivers {
		for _, mode := range []idempotency.Mode{idempotency.ModeTwoStep, idempotency.ModeTransactional} {
			t.Run(driver+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t, testdb.MaxConns(2))
				if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE conformance_charge (id bigserial PRIMARY KEY, principal text NOT NULL, body jsonb NOT NULL)`); err != nil {
					t.Fatal(err)
				}
				sdb := db.SQL(t, driver, 16)
				const retention = 2 * time.Second
				mw, err := idempotency.New(idempotency.NewSQLStore(sdb), &idempotency.Config{
					Scope: func(r *http.Request) (string, error) {
						if a := r.Header.Get("Authorization"); a != "" {
							return a, nil
						}
						return "", errors.New("no credentials")
					},
					Mode:      mode,
					Retention: retention,
					Lease:     retention / 2,
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
					if tx, ok := idempotency.SQLTxFromContext(r.Context()); ok {
						err = tx.QueryRowContext(r.Context(), q, r.Header.Get("Authorization"), string(body)).Scan(&id)
					} else if mode == idempotency.ModeTransactional {
						err = errors.New("no *sql.Tx in transactional mode")
					} else {
						err = sdb.QueryRowContext(r.Context(), q, r.Header.Get("Authorization"), string(body)).Scan(&id)
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
}
