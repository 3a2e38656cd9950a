package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

// txDBs are the two kinds of DB PostgresStore's transactional mode runs on:
// a pool (BEGIN and COMMIT pipelined with the claim and the record) and a
// single connection (plain statements).
var txDBs = []struct {
	name string
	db   func(t *testing.T, db *testdb.DB) idempotency.DB
}{
	{"pool", func(t *testing.T, db *testdb.DB) idempotency.DB { return db.Pool }},
	{"conn", func(t *testing.T, db *testdb.DB) idempotency.DB { return db.Conn(t) }},
}

func TestTxStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	resp := &idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":7}`)}
	for _, d := range txDBs {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			if _, err := db.Pool.Exec(ctx, "CREATE TABLE orders (id bigint PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			s := idempotency.NewPostgresStore(d.db(t, db))
			check := idempotency.NewPostgresStore(db.Pool)

			// Claim, write through the transaction (with a savepoint
			// rolled back), commit with the response: replayed after.
			c := claimOf("k1", "a", time.Hour, time.Hour)
			tx, res, err := s.BeginClaim(ctx, c)
			if err != nil || res.Outcome != idempotency.OutcomeClaimed || tx == nil {
				t.Fatalf("BeginClaim = %v, %+v, %v", tx, res, err)
			}
			sp, err := tx.Tx().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sp.Exec(ctx, "INSERT INTO orders VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			if err := sp.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Tx().Exec(ctx, "INSERT INTO orders VALUES (2)"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx, resp, time.Hour); err != nil {
				t.Fatalf("ClaimTx.Commit: %v", err)
			}
			var ids []int64
			rows, _ := db.Pool.Query(ctx, "SELECT id FROM orders ORDER BY id")
			ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil || len(ids) != 1 || ids[0] != 2 {
				t.Fatalf("orders %v, %v; want [2]", ids, err)
			}
			if r, err := check.Claim(ctx, c); err != nil || r.Outcome != idempotency.OutcomeCompleted || string(r.Response.Body) != `{"id":7}` {
				t.Fatalf("after commit: %+v, %v", r, err)
			}
			if _, r, _ := s.BeginClaim(ctx, c); r.Outcome != idempotency.OutcomeCompleted {
				t.Fatalf("BeginClaim after commit = %v, want completed", r.Outcome)
			}
			if _, r, _ := s.BeginClaim(ctx, claimOf("k1", "b", time.Hour, time.Hour)); r.Outcome != idempotency.OutcomeMismatch {
				t.Fatalf("BeginClaim other fingerprint = %v, want mismatch", r.Outcome)
			}

			// Rollback leaves nothing.
			c2 := claimOf("k2", "a", time.Hour, time.Hour)
			tx, _, err = s.BeginClaim(ctx, c2)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Tx().Exec(ctx, "INSERT INTO orders VALUES (3)"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if n := countRows(t, db.Pool, "orders"); n != 1 {
				t.Fatalf("orders after rollback: %d", n)
			}
			if r, _ := check.Claim(ctx, claimOf("k2", "zzz", time.Hour, time.Hour)); r.Outcome != idempotency.OutcomeClaimed {
				t.Fatalf("rolled-back key: %v, want a fresh claim", r.Outcome)
			}

			// A two-step claim slipping in between the transactional claim
			// and its record fences the transaction out: all rolled back.
			c3 := claimOf("k3", "a", time.Hour, time.Hour)
			tx, _, err = s.BeginClaim(ctx, c3)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Tx().Exec(ctx, "INSERT INTO orders VALUES (4)"); err != nil {
				t.Fatal(err)
			}
			if r, _ := check.Claim(ctx, c3); r.Outcome != idempotency.OutcomeClaimed {
				t.Fatalf("two-step claim beside the open transaction: %v", r.Outcome)
			}
			if err := tx.Commit(ctx, resp, time.Hour); !errors.Is(err, idempotency.ErrFenced) {
				t.Fatalf("ClaimTx.Commit after a two-step claim = %v, want ErrFenced", err)
			}
			if n := countRows(t, db.Pool, "orders"); n != 1 {
				t.Fatalf("orders after fenced commit: %d, want the write rolled back", n)
			}

			// An abandoned two-step claim: in progress until its lease
			// ends, then taken over transactionally.
			c4 := claimOf("k4", "a", 50*time.Millisecond, time.Hour)
			if _, err := check.Claim(ctx, c4); err != nil {
				t.Fatal(err)
			}
			var r4 idempotency.ClaimResult
			eventually(t, "transactional takeover", func() bool {
				tx, r4, err = s.BeginClaim(ctx, claimOf("k4", "a", time.Hour, time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				return r4.Outcome != idempotency.OutcomeInProgress
			})
			if r4.Outcome != idempotency.OutcomeTookOver {
				t.Fatalf("after the lease: %v, want took over", r4.Outcome)
			}
			if err := tx.Commit(ctx, resp, time.Hour); err != nil {
				t.Fatalf("ClaimTx.Commit after takeover: %v", err)
			}
			if r, _ := check.Claim(ctx, c4); r.Outcome != idempotency.OutcomeCompleted {
				t.Fatalf("after transactional takeover: %v", r.Outcome)
			}
		})
	}
}
