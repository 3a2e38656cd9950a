package consume_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/migrate"
)

// ExampleNew runs the broker-neutral loop on the franz-go driver with a
// handler of *consume.Message: the same event delivered twice (as a relay
// that crashed before marking it published would send it) is applied once.
func ExampleNew() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (order_id text PRIMARY KEY)`); err != nil {
		fmt.Println(err)
		return
	}
	// An in-process broker; a service passes its brokers.
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "orders.dlq"))
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	drv, err := kafka.NewDriver(&kafka.ConsumerConfig{Brokers: brokers, Group: "shipping", Topics: []string{"orders"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	settled := make(chan struct{}, 10)
	c, err := consume.New(pool, drv, func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
		// Commits together with the message's processed_event row.
		_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, string(m.Key))
		return err
	}, &consume.Config{
		ConsumerID: "shipping",
		Hook: func(ctx context.Context, e consume.Event) context.Context {
			if e.Kind == consume.KindProcessed || e.Kind == consume.KindDuplicate {
				fmt.Println(e.EventID, e.Kind)
				settled <- struct{}{}
			}
			return ctx
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	prod, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"))
	defer prod.Close()
	rec := func() *kgo.Record {
		return &kgo.Record{Key: []byte("order-42"), Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte("ev-1")}}}
	}
	if err := prod.ProduceSync(ctx, rec(), rec()).FirstErr(); err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		<-settled
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		fmt.Println("stop:", err)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&n)
	fmt.Println("shipments:", n)
	// Output:
	// ev-1 processed
	// ev-1 duplicate
	// shipments: 1
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
