package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// The claim runs without JIT. With JIT thresholds at zero (every plan
// compiled, as the claim's is on a default server when its cost estimate
// crosses jit_above_cost), the claim's EXPLAIN ANALYZE reports JIT
// compilation in a plain transaction and none in one opened the way the
// relay opens its claims (BeginClaim).
func TestClaimRunsWithoutJIT(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	var available bool
	if err := db.Pool.QueryRow(ctx, "SELECT pg_jit_available()").Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		t.Fatal("this server has no JIT provider (llvmjit): the test needs one to prove the claim avoids it")
	}
	enqueue(t, db.Pool, msg("a", 1), msg("a", 2), msg("b", 1))
	explain := func(begin string) string {
		t.Helper()
		tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		// SET LOCAL, not SET: the pool's connection goes back to the pool.
		if _, err := tx.Exec(ctx, "SET LOCAL jit_above_cost = 0; SET LOCAL jit_inline_above_cost = 0; SET LOCAL jit_optimize_above_cost = 0"); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, FORMAT TEXT) "+outbox.ClaimLockedSQL, "", "", 20, 10)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	if plan := explain("BEGIN"); !strings.Contains(plan, "JIT:") {
		t.Fatalf("with JIT forced on, a plain transaction's claim shows no JIT (the test proves nothing):\n%s", plan)
	}
	if plan := explain(outbox.BeginClaim); strings.Contains(plan, "JIT:") {
		t.Fatalf("the relay's claim transaction compiles the claim with JIT:\n%s", plan)
	}
}
