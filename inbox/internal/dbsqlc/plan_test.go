package dbsqlc

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPurgeBatchPlanUsesTheIndex: with the old rows few and all at the
// table's end (as they are once retention has kept millions of newer
// ones ahead of them), a purge batch is found through the processed_at
// index. Without ORDER BY the planner expected the old rows spread evenly
// and chose a sequential scan, stopping once it had a batch: in fact the
// whole table per batch (1.5 s a batch with 3 M rows kept).
func TestPurgeBatchPlanUsesTheIndex(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := t.Context()
	for _, q := range []string{
		`INSERT INTO processed_event (consumer_id, event_id, processed_at)
		 SELECT 'c', 'kept-' || g, now() FROM generate_series(1, 200000) g`,
		`INSERT INTO processed_event (consumer_id, event_id, processed_at)
		 SELECT 'c', 'old-' || g, now() - interval '30 days' FROM generate_series(1, 20000) g`,
		`ANALYZE processed_event`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := db.Pool.Query(ctx, "EXPLAIN "+purgeBatch, time.Now().Add(-7*24*time.Hour), int32(100))
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	p := strings.Join(plan, "\n")
	if strings.Contains(p, "Seq Scan on processed_event") || !strings.Contains(p, "processed_event_processed_at_idx") {
		t.Fatalf("the purge batch is not found through the processed_at index:\n%s", p)
	}
}
