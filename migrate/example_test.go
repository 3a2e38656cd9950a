package migrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/migrate"
)

// exampleSchema creates a throwaway schema on the test server and returns
// a URL that selects it, and a func that drops it: what a real program
// would get from DATABASE_URL.
func exampleSchema() (string, func()) {
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "ex_" + hex.EncodeToString(b[:])
	admin := func(sql string) {
		c, err := pgx.Connect(ctx, exampleDatabaseURL())
		if err != nil {
			panic(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, sql); err != nil {
			panic(err)
		}
	}
	admin("CREATE SCHEMA " + schema)
	url, err := withSearchPath(exampleDatabaseURL(), schema)
	if err != nil {
		panic(err)
	}
	return url, func() { admin("DROP SCHEMA " + schema + " CASCADE") }
}

// Example migrates a database with idem's tables at start-up, as billing
// does. Up is safe to run from every instance at once.
func Example() {
	url, drop := exampleSchema()
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	applied, err := migrate.Up(ctx, pool)
	if err != nil {
		panic(err)
	}
	m, _ := migrate.Default()
	fmt.Println("applied every version:", len(applied) == m.Latest())

	again, _ := migrate.Up(ctx, pool)
	fmt.Println("second Up applied:", again)

	st, err := migrate.GetStatus(ctx, pool)
	if err != nil {
		panic(err)
	}
	fmt.Println("pending:", st.Pending(), "first:", st.Migrations[0].Name, st.Migrations[0].State())
	// Output:
	// applied every version: true
	// second Up applied: []
	// pending: 0 first: idempotency_key applied
}

// Example_applicationSet keeps an application's own migrations beside
// idem's, in a version table of their own, and shows what happens when an
// applied migration is edited afterwards.
func Example_applicationSet() {
	url, drop := exampleSchema()
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	files := fstest.MapFS{ // in a real program: //go:embed migrations/*.sql
		"migrations/001_orders.up.sql":        {Data: []byte("CREATE TABLE orders (id text PRIMARY KEY);")},
		"migrations/001_orders.down.sql":      {Data: []byte("DROP TABLE orders;")},
		"migrations/002_order_total.up.sql":   {Data: []byte("ALTER TABLE orders ADD COLUMN total bigint;")},
		"migrations/002_order_total.down.sql": {Data: []byte("ALTER TABLE orders DROP COLUMN total;")},
	}
	app, err := migrate.Load(files, "migrations", &migrate.Config{Table: "app_migration"})
	if err != nil {
		panic(err)
	}
	applied, err := app.Up(ctx, pool)
	fmt.Println("applied:", applied, err)

	// Someone edits 001 after it shipped.
	files["migrations/001_orders.up.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE orders (id bigint PRIMARY KEY);")}
	edited, _ := migrate.Load(files, "migrations", &migrate.Config{Table: "app_migration"})
	st, err := edited.Status(ctx, pool)
	fmt.Println("001:", st.Migrations[0].State())
	fmt.Println(errors.Is(err, migrate.ErrMigrationChanged))
	// Output:
	// applied: [1 2] <nil>
	// 001: applied, checksum mismatch
	// true
}
