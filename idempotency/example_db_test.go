package idempotency_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log"
	"net/url"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/migrate"
)

// exampleDatabaseURL is the database the examples use: TEST_DATABASE_URL,
// else the local server. A program uses its own DATABASE_URL.
func exampleDatabaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// withSearchPath returns rawURL with its search_path set to schema, so that
// an example works in a schema of its own and drops it after.
func withSearchPath(rawURL, schema string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// newExampleDB gives an example a pool on a fresh schema of the example
// database, migrated with migrate.Up, and a func that drops the schema. A
// program connects to its own database and migrates it once (migrate.Up or
// `idem migrate up`).
func newExampleDB() (*exampleDB, func()) {
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "ex_" + hex.EncodeToString(b[:])
	admin := func(sql string) {
		c, err := pgx.Connect(ctx, exampleDatabaseURL())
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, sql); err != nil {
			log.Fatal(err)
		}
	}
	admin("CREATE SCHEMA " + schema)
	dsn, err := withSearchPath(exampleDatabaseURL(), schema)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrate.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	return &exampleDB{Pool: pool}, func() {
		pool.Close()
		admin("DROP SCHEMA " + schema + " CASCADE")
	}
}

type exampleDB struct{ Pool *pgxpool.Pool }
