package pgwire_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgwire"
	"github.com/idemkit/idem/internal/testdb"
)

// TestCounter checks the counts against what pgx is known to send: a
// simple query is one Query and one round trip, an extended-protocol
// statement one Sync and one round trip, a batch of three statements one
// Sync and one round trip, whatever the statement cache did at connect.
func TestCounter(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	c := pgwire.NewCounter()
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = c.DialFunc(nil)
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ctx := t.Context()
	// Warm the statement cache: a first statement is prepared in a
	// round trip of its own.
	var n int
	if err := conn.QueryRow(ctx, "select $1::int", 1).Scan(&n); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select 2")
	b.Queue("select $1::int", 3)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}

	testCases := []struct {
		name                     string
		run                      func() error
		roundTrips, syncs, query int
	}{
		{"simple query", func() error {
			_, err := conn.Exec(ctx, "select 1", pgx.QueryExecModeSimpleProtocol)
			return err
		}, 1, 0, 1},
		{"cached statement", func() error { return conn.QueryRow(ctx, "select $1::int", 2).Scan(&n) }, 1, 1, 0},
		{"batch of three", func() error {
			b := &pgx.Batch{}
			b.Queue("select 1")
			b.Queue("select 2")
			b.Queue("select $1::int", 3)
			return conn.SendBatch(ctx, b).Close()
		}, 1, 1, 0},
		{"new statement", func() error { return conn.QueryRow(ctx, "select $1::int + 1", 2).Scan(&n) }, 2, 2, 0},
	}
	for _, tt := range testCases {
		c.Reset()
		if err := tt.run(); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got := c.Counts()
		if got.RoundTrips != tt.roundTrips || got.Syncs != tt.syncs || got.Queries != tt.query {
			t.Errorf("%s: %d round trips, %d syncs, %d queries; want %d, %d, %d (messages %v)",
				tt.name, got.RoundTrips, got.Syncs, got.Queries, tt.roundTrips, tt.syncs, tt.query, got.Messages)
		}
	}
}
