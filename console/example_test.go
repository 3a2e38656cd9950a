package console_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
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

// Example mounts the console on an admin server and opens its outbox page,
// which counts the events by status. Without Config.Token the console
// answers loopback clients only; set a token (IDEM_CONSOLE_TOKEN) before
// it listens anywhere else.
func Example() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	tx, _ := pool.Begin(ctx)
	if _, err := outbox.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders.events", AggregateType: "order", AggregateID: "42", Payload: []byte(`{}`)}); err != nil {
		fmt.Println(err)
		return
	}
	_ = tx.Commit(ctx)

	c, err := console.New(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	admin := httptest.NewServer(c) // a service mounts c on its admin mux
	defer admin.Close()
	resp, err := http.Get(admin.URL + "/outbox")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, strings.Contains(string(page), "PENDING"))
	// Output:
	// 200 true
}

// exampleDB is a pool on a fresh schema of TEST_DATABASE_URL (else the
// local server), migrated with migrate.Up, and a func that drops it. A
// program connects to its own database and migrates it once.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "ex_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		panic(err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		panic(err)
	}
	if _, err := migrate.Up(ctx, pool); err != nil {
		panic(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(ctx)
	}
}
