package storetest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/storetest"
	"github.com/idemkit/idem/migrate"
)

// A store's own test runs the suite; each subtest gets a fresh store. An
// in-memory store needs nothing more; a TxStore runs RunTx, which adds the
// transactional claim. newPostgresStore is the part a store's author
// writes: here idem's PostgreSQL store on a schema of its own.
func ExampleRun() {
	testMyStore := func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) idempotency.Store {
			return idempotency.NewMemoryStore() // or your own Store
		})
	}
	testPostgresStore := func(t *testing.T) {
		storetest.RunTx(t, func(t *testing.T) idempotency.TxStore {
			store, drop, err := newPostgresStore(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(drop)
			return store
		})
	}
	_, _ = testMyStore, testPostgresStore // func TestMyStore(t *testing.T) { ... }
}

// Example_racers runs, on its own, what the suite's race check does to a
// store: storetest.Racers goroutines claim one key at once and exactly one
// wins; the others find it in progress.
func Example_racers() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, drop, err := newPostgresStore(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()

	claim := idempotency.Claim{
		Key:         idempotency.HashKey("tenant-1", "POST", "/orders", "order-42"),
		Fingerprint: idempotency.Fingerprint{42},
		Lease:       storetest.Long, Retention: storetest.Long,
	}
	var mu sync.Mutex
	outcomes := map[idempotency.Outcome]int{}
	var wg sync.WaitGroup
	for range storetest.Racers {
		wg.Go(func() {
			res, err := store.Claim(ctx, claim)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fmt.Println(err)
				return
			}
			outcomes[res.Outcome]++
		})
	}
	wg.Wait()
	fmt.Println(idempotency.OutcomeClaimed, outcomes[idempotency.OutcomeClaimed])
	fmt.Println(idempotency.OutcomeInProgress, outcomes[idempotency.OutcomeInProgress])
	// Output:
	// claimed 1
	// in_progress 49
}

// newPostgresStore returns idem's PostgreSQL store on a fresh schema of
// TEST_DATABASE_URL (else the local server), migrated with migrate.Up,
// with connections enough for the suite's racers, and a func that drops
// the schema.
func newPostgresStore(ctx context.Context) (idempotency.TxStore, func(), error) {
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "ex_" + hex.EncodeToString(b[:])
	admin := func(sql string) error {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := admin("CREATE SCHEMA " + schema); err != nil {
		return nil, nil, err
	}
	drop := func() { _ = admin("DROP SCHEMA " + schema + " CASCADE") }
	u, err := url.Parse(dsn)
	if err != nil {
		drop()
		return nil, nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("pool_max_conns", fmt.Sprint(storetest.Racers/2)) // racers claim at once: give them connections to race on
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		drop()
		return nil, nil, err
	}
	if _, err := migrate.Up(ctx, pool); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return idempotency.NewPostgresStore(pool), func() { pool.Close(); drop() }, nil
}
