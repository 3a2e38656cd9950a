// Package testdb gives each test its own PostgreSQL schema on a real server.
//
// The server comes from TEST_DATABASE_URL, else the local server
// (postgres://postgres@127.0.0.1:5432/test). An unreachable server fails the
// test: it is never skipped, in CI or anywhere else, because a skipped
// database test proves nothing.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/migrate"
)

// DefaultURL is used when TEST_DATABASE_URL is empty.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns the base URL of the test server.
func URL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's database: a pool whose search_path is the test's own
// schema, and a URL that selects the same schema (for child processes).
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
	URL    string
}

type options struct {
	maxConns int32
	migrate  bool
}

// Option changes what New sets up.
type Option func(*options)

// MaxConns sets the pool size. Defaults to 8.
func MaxConns(n int32) Option { return func(o *options) { o.maxConns = n } }

// Empty leaves the schema without idem's migrations.
func Empty() Option { return func(o *options) { o.migrate = false } }

// adminExec runs one statement on a short-lived connection, so that no
// pool outlives the test binary's goroutine-leak check.
func adminExec(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, URL())
	if err != nil {
		return fmt.Errorf("testdb: PostgreSQL at %s is unreachable (start it, or set TEST_DATABASE_URL): %w", redact(URL()), err)
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, sql)
	return err
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}

// New creates a fresh schema, migrates it with idem's embedded migrations
// (unless Empty), and drops it when the test ends.
func New(t testing.TB, opts ...Option) *DB {
	t.Helper()
	o := options{maxConns: 8, migrate: true}
	for _, opt := range opts {
		opt(&o)
	}
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	if err := adminExec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("testdb: create schema: %v", err)
	}
	t.Cleanup(func() {
		if err := adminExec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("testdb: drop schema %s: %v", schema, err)
		}
	})

	dsn, err := WithSchema(URL(), schema)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = o.maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if o.migrate {
		if _, err := migrate.Up(ctx, pool); err != nil {
			t.Fatalf("testdb: migrate: %v", err)
		}
	}
	return &DB{Pool: pool, Schema: schema, URL: dsn}
}

// WithSchema returns rawURL with search_path set to schema as a run-time
// parameter, which pgx sends in the startup message, so that child processes
// given the URL work in the same schema.
func WithSchema(rawURL, schema string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("testdb: parse URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Conn opens a single connection to the test's schema, closed at test end.
// Use it where separate sessions matter (locks, LISTEN).
func (db *DB) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), db.URL)
	if err != nil {
		t.Fatalf("testdb: connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// NewForExample is New for runnable examples, which have no testing.TB: a
// fresh migrated schema and a pool on it, and a func that closes the pool
// and drops the schema. A failure panics, which fails the example.
func NewForExample() (*DB, func()) {
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "x_" + hex.EncodeToString(b[:])
	if err := adminExec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(fmt.Sprintf("testdb: create schema: %v", err))
	}
	drop := func() { _ = adminExec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") }
	dsn, err := WithSchema(URL(), schema)
	if err != nil {
		drop()
		panic(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err == nil {
		_, err = migrate.Up(ctx, pool)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		drop()
		panic(fmt.Sprintf("testdb: %v", err))
	}
	return &DB{Pool: pool, Schema: schema, URL: dsn}, func() {
		pool.Close()
		drop()
	}
}

// SQLDrivers are the database/sql driver names every database/sql test
// runs on: lib/pq ("postgres") and pgx's stdlib ("pgx"). The test package
// registers them with blank imports of github.com/lib/pq and
// github.com/jackc/pgx/v5/stdlib.
var SQLDrivers = []string{"postgres", "pgx"}

// SQL opens a database/sql pool on the test's schema with driver (one of
// SQLDrivers), at most maxConns connections, closed at test end.
func (db *DB) SQL(t testing.TB, driver string, maxConns int) *sql.DB {
	t.Helper()
	s, err := sql.Open(driver, db.URL)
	if err != nil {
		t.Fatalf("testdb: sql.Open(%q): %v", driver, err)
	}
	s.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { _ = s.Close() })
	if err := s.PingContext(context.Background()); err != nil {
		t.Fatalf("testdb: %s: ping: %v", driver, err)
	}
	return s
}
