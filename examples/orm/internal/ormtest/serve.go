package ormtest

import (
	"context"
	"database/sql"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/migrate"
)

// Serve is the examples' main: it migrates DATABASE_URL (idem's tables
// and the examples'), opens database/sql on it (pgx's stdlib driver), and
// serves POST /orders, from orders(sdb), behind the transactional
// idempotency middleware on :8080.
func Serve(orders func(sdb *sql.DB) (http.Handler, error)) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test"
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url) // migrations only
	if err != nil {
		log.Fatal(err)
	}
	_, err = migrate.Up(ctx, pool)
	if err == nil {
		_, err = pool.Exec(ctx, Schema)
	}
	pool.Close()
	if err != nil {
		log.Fatal(err)
	}
	sdb, err := sql.Open("pgx", url)
	if err != nil {
		log.Fatal(err)
	}
	h, err := orders(sdb)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewSQLStore(sdb), &idempotency.Config{
		Mode:  idempotency.ModeTransactional,
		Scope: func(*http.Request) (string, error) { return "demo", nil }, // your authenticated principal
	})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /orders", mw.Wrap(h))
	log.Fatal(http.ListenAndServe(":8080", nil))
}
