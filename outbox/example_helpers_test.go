package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/migrate"
)

// exampleDB gives an example a pool on a fresh, migrated schema of the test
// database (TEST_DATABASE_URL, else the local server) and a func that drops
// it. A real program connects to its own database and runs migrate.Up (or
// `idem migrate`) once.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
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
	url, err := withSearchPath(exampleDatabaseURL(), schema)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
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
