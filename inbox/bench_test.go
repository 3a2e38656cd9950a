package inbox_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// BenchmarkMarkProcessed measures one MarkProcessedTx in its own transaction
// (begin, mark, commit), per form, for a first delivery and for a duplicate.
// The figures behind FormDefault are in doc.go.
func BenchmarkMarkProcessed(b *testing.B) {
	for _, f := range forms {
		for _, dup := range []bool{false, true} {
			name := string(f) + "/first"
			if dup {
				name = string(f) + "/duplicate"
			}
			b.Run(name, func(b *testing.B) {
				db := testdb.New(b)
				ib := newInbox(b, f)
				ctx := context.Background()
				if dup {
					if _, err := db.Pool.Exec(ctx, `INSERT INTO processed_event (consumer_id, event_id) SELECT 'c', 'e' || g FROM generate_series(0, 999) g`); err != nil {
						b.Fatal(err)
					}
				}
				var size0 int64
				if err := db.Pool.QueryRow(ctx, `SELECT pg_relation_size('processed_event')`).Scan(&size0); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					id := "e" + strconv.Itoa(i)
					if dup {
						id = "e" + strconv.Itoa(i%1000)
					}
					tx, err := db.Pool.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					first, err := ib.MarkProcessedTx(ctx, tx, "c", id)
					if err != nil || first == dup {
						b.Fatalf("first = %v, err = %v", first, err)
					}
					if err := tx.Commit(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				// Heap growth per mark: under DO UPDATE every duplicate leaves
				// a dead row version behind.
				var size1 int64
				if err := db.Pool.QueryRow(ctx, `SELECT pg_relation_size('processed_event')`).Scan(&size1); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(size1-size0)/float64(b.N), "heap-B/op")
			})
		}
	}
}
