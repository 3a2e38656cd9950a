package testdb_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSchemasAreIsolatedAndDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var schema string
	t.Run("inner", func(t *testing.T) {
		a, b := testdb.New(t), testdb.New(t)
		schema = a.Schema
		if _, err := a.Pool.Exec(ctx, `INSERT INTO processed_event (consumer_id, event_id) VALUES ('c', 'e')`); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := b.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("second schema sees %d rows (%v), want 0", n, err)
		}
		if err := a.Conn(t).QueryRow(ctx, `SELECT count(*) FROM processed_event`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("Conn on the first schema sees %d rows (%v), want 1", n, err)
		}
	})
	other := testdb.New(t, testdb.Empty())
	var exists bool
	if err := other.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("schema %s survived its test", schema)
	}
}
