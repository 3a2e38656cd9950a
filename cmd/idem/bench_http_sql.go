package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver of sql-transactional

	"github.com/idemkit/idem/idempotency"
)

// benchSQLTransactional is sql-transactional: transactional's middleware
// (ModeTransactional: claim, the handler's row and the response in one
// commit) over database/sql, on pgx's stdlib driver and
// idempotency.NewSQLStore, in front of the same handler write (one row,
// through idempotency.SQLTxFromContext), for the ratio to transactional in
// the same rounds. It serves POST /sql-transactional/rows on mux; the
// returned func closes its pool.
func benchSQLTransactional(schemaURL string, clients int, mux *http.ServeMux, scope func(*http.Request) (string, error),
	newKey func() string, conns *benchConns) (v benchVariant, closeDB func(), err error) {
	db, err := sql.Open("pgx", schemaURL)
	if err != nil {
		return benchVariant{}, nil, fmt.Errorf("sql-transactional: %w", err)
	}
	// One connection per client, as transactional's pool.
	db.SetMaxOpenConns(clients)
	db.SetMaxIdleConns(clients)
	mw, err := idempotency.New(idempotency.NewSQLStore(db), &idempotency.Config{Scope: scope, Mode: idempotency.ModeTransactional})
	if err != nil {
		_ = db.Close()
		return benchVariant{}, nil, err
	}
	mux.Handle("POST /sql-transactional/rows", mw.Wrap(benchRowHandler(func(ctx context.Context) (int64, error) {
		tx, ok := idempotency.SQLTxFromContext(ctx)
		if !ok {
			return 0, errors.New("no request transaction")
		}
		var id int64
		err := tx.QueryRowContext(ctx, `INSERT INTO bench_http_row (body) VALUES ($1) RETURNING id`, benchHTTPBody).Scan(&id)
		return id, err
	})))
	return benchVariant{name: "sql-transactional", op: func(ctx context.Context) error {
		return conns.post(ctx, "/sql-transactional/rows", newKey(), http.StatusCreated)
	}}, func() { _ = db.Close() }, nil
}

// benchSQLTransactionalRatio logs sql-transactional / transactional.
func benchSQLTransactionalRatio(log io.Writer, byName map[string]benchResult) {
	if base := byName["transactional"].OpsPerSec; base > 0 {
		r := byName["sql-transactional"].OpsPerSec / base
		verdict := "met"
		if r < 0.8 {
			verdict = "NOT met"
		}
		fmt.Fprintf(log, "http: sql-transactional / transactional = %.2f (target ≥ 0.8: %s)\n", r, verdict)
	}
}
