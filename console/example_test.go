package console_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/console"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/outbox"
)

// Example mounts the console under /admin/console on a service's admin
// mux, with a token, and opens its outbox page, which counts the events by
// status: one event is PENDING. A browser without the token is sent to the
// login form. Start runs the backlog sampler that draws the page's chart;
// Stop ends it, before the pool closes.
func Example() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	if err := enqueueOne(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}

	c, err := console.New(pool, &console.Config{Token: "s3cret"}) // IDEM_CONSOLE_TOKEN
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = c.Stop(ctx) }()
	mux := http.NewServeMux()
	mux.Handle("/admin/console/", console.Mount("/admin/console", c))
	admin := httptest.NewServer(mux) // a service serves mux on its admin port
	defer admin.Close()

	for _, token := range []string{"", "s3cret"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, admin.URL+"/admin/console/outbox", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := admin.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		page, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Request.URL.Path, strings.Contains(string(page), "PENDING"))
	}
	// Output:
	// 200 /admin/console/login false
	// 200 /admin/console/outbox true
}

// enqueueOne writes one event to the outbox, in a transaction of its own.
// The deferred Rollback ends the transaction on every early return (after
// Commit it does nothing), so the pool can close.
func enqueueOne(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := outbox.EnqueueTx(ctx, tx, outbox.Message{
		Topic: "orders.events", EventType: "OrderPlaced", AggregateType: "order", AggregateID: "42", Payload: []byte(`{}`),
	}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// exampleDB is a pool on a fresh schema of TEST_DATABASE_URL (else the
// local server), migrated with migrate.Up, and a func that drops it. A
// program connects to its own database and migrates it once (migrate.Up or
// `idem migrate up`).
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "ex_" + hex.EncodeToString(b[:])
	admin := func(sql string) {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, sql); err != nil {
			log.Fatal(err)
		}
	}
	admin("CREATE SCHEMA " + schema)
	u, err := url.Parse(dsn)
	if err != nil {
		log.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrate.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		admin("DROP SCHEMA " + schema + " CASCADE")
	}
}
