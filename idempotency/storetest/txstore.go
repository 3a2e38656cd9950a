package storetest

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// RunTx runs the suite of Run and, in addition, the transactional claim
// (ModeTransactional): BeginClaim, ClaimTx.Commit and Rollback, racing
// transactional claims that must not wait for each other, and a handler
// statement that fails inside the claim's transaction. The last needs
// PostgreSQL's SQL, as ClaimTx does.
func RunTx(t *testing.T, newStore func(t *testing.T) idempotency.TxStore) {
	t.Helper()
	Run(t, func(t *testing.T) idempotency.Store { return newStore(t) })
	for _, tt := range []struct {
		name string
		fn   func(t *testing.T, s idempotency.TxStore)
	}{
		{"TxClaimCommitReplay", testTxCommit},
		{"TxRollbackLeavesNoTrace", testTxRollback},
		{"TxConcurrentClaimsOneWinnerNoWait", testTxConcurrent},
		{"TxNotClaimedLeavesNoTx", testTxNotClaimed},
		{"TxCommitFencedByTwoStepClaim", testTxFencedByTwoStep},
		{"TxFailedStatementThen4xxIsStored", testTxFailedStatement4xx},
		{"TxFailedStatementThenSuccessIsAborted", testTxFailedStatementSuccess},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

func beginClaim(t *testing.T, s idempotency.TxStore, c idempotency.Claim, want idempotency.Outcome) (*idempotency.ClaimTx, idempotency.ClaimResult) {
	t.Helper()
	tx, res, err := s.BeginClaim(t.Context(), c)
	rollbackAtEnd(t, tx)
	if err != nil {
		t.Fatalf("BeginClaim: %v", err)
	}
	if res.Outcome != want {
		t.Fatalf("BeginClaim outcome %s, want %s", res.Outcome, want)
	}
	owns := want == idempotency.OutcomeClaimed || want == idempotency.OutcomeTookOver
	if owns != (tx != nil) {
		t.Fatalf("BeginClaim %s returned tx %v: an open transaction exactly when the key is owned", res.Outcome, tx)
	}
	// Fence may be 0 here: the transaction is the fence.
	if res.Fence < 0 {
		t.Fatalf("%s with fence %d", res.Outcome, res.Fence)
	}
	return tx, res
}

// rollbackAtEnd ends tx when the test ends, whatever happened: an open
// transaction would hold its connection, and the store's pool could never
// close. Rolling back a committed transaction does nothing.
func rollbackAtEnd(t *testing.T, tx *idempotency.ClaimTx) {
	if tx != nil {
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	}
}

func testTxCommit(t *testing.T, s idempotency.TxStore) {
	k := newKey(t)
	tx, _ := beginClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	if tx.SQLTx() == nil {
		if err := tx.Tx().Commit(t.Context()); !errors.Is(err, idempotency.ErrTxOwned) {
			t.Fatalf("the claim's own pgx.Tx Commit: %v, want ErrTxOwned (only ClaimTx.Commit ends it)", err)
		}
	}
	if err := tx.Commit(t.Context(), sampleResponse(), Long); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context(), sampleResponse(), Long); err == nil {
		t.Fatal("a second Commit of one ClaimTx succeeded")
	}
	got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	sameResponse(t, got.Response, sampleResponse())
	_, got = beginClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	sameResponse(t, got.Response, sampleResponse())
	beginClaim(t, s, claimOf(k, fp("b"), Long, Long), idempotency.OutcomeMismatch)
}

// testTxRollback: a crash (or a failing handler) in transactional mode
// rolls the claim back with everything else, so a retry runs at once, even
// with another body.
func testTxRollback(t *testing.T, s idempotency.TxStore) {
	k := newKey(t)
	tx, _ := beginClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	tx, _ = beginClaim(t, s, claimOf(k, fp("b"), Long, Long), idempotency.OutcomeClaimed)
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, claimOf(k, fp("c"), Long, Long), idempotency.OutcomeClaimed)
}

// testTxConcurrent: Racers transactional claims of one key at once. The
// winner keeps its transaction open until every other racer has answered,
// so a racer that waited for the winner's transaction (instead of
// answering in-progress at once) would never answer: it runs into the
// deadline and fails the test.
func testTxConcurrent(t *testing.T, s idempotency.TxStore) {
	k := newKey(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := make(chan struct{})
	var (
		mu     sync.Mutex
		counts = map[idempotency.Outcome]int{}
		won    []*idempotency.ClaimTx
		errs   []error
		wg     sync.WaitGroup
	)
	for range Racers {
		wg.Go(func() {
			<-start
			tx, res, err := s.BeginClaim(ctx, claimOf(k, fp("a"), Long, Long))
			mu.Lock()
			defer mu.Unlock()
			rollbackAtEnd(t, tx)
			if err != nil {
				errs = append(errs, err)
				return
			}
			counts[res.Outcome]++
			if tx != nil {
				won = append(won, tx)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d racing BeginClaims failed (a racer that waits for the winner's transaction times out), first: %v", len(errs), Racers, errs[0])
	}
	if len(won) != 1 || counts[idempotency.OutcomeClaimed] != 1 || counts[idempotency.OutcomeInProgress] != Racers-1 {
		t.Fatalf("%d racing transactional claims: %v with %d open transactions, want exactly 1 claimed and %d in progress", Racers, counts, len(won), Racers-1)
	}
	if err := won[0].Commit(ctx, sampleResponse(), Long); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
}

func testTxNotClaimed(t *testing.T, s idempotency.TxStore) {
	k := newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	beginClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeInProgress)
	if err := s.Complete(t.Context(), k, r.Fence, sampleResponse(), Long); err != nil {
		t.Fatal(err)
	}
	beginClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
}

// testTxFencedByTwoStep: a transactional claim writes nothing until it
// commits, so a two-step claim of the same key meanwhile wins the key; the
// transactional commit must then fail with ErrFenced (rolling back its
// writes) and the two-step owner's result stands.
func testTxFencedByTwoStep(t *testing.T, s idempotency.TxStore) {
	k := newKey(t)
	tx, _ := beginClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	res, err := s.Claim(t.Context(), claimOf(k, fp("a"), Long, Long))
	if err != nil {
		t.Fatal(err)
	}
	switch res.Outcome {
	case idempotency.OutcomeInProgress:
		// The store makes two-step claims see the open transaction: the
		// transactional owner keeps the key.
		if err := tx.Commit(t.Context(), sampleResponse(), Long); err != nil {
			t.Fatalf("CommitComplete: %v", err)
		}
		mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	case idempotency.OutcomeClaimed:
		other := &idempotency.Response{Status: http.StatusAccepted, Body: []byte("two-step")}
		if err := s.Complete(t.Context(), k, res.Fence, other, Long); err != nil {
			t.Fatalf("two-step Complete: %v", err)
		}
		if err := tx.Commit(t.Context(), sampleResponse(), Long); !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("CommitComplete after a two-step owner completed: %v, want ErrFenced", err)
		}
		got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
		sameResponse(t, got.Response, other)
	default:
		t.Fatalf("two-step Claim while a transactional claim is open: %s, want claimed or in_progress", res.Outcome)
	}
}

// testTxFailedStatement4xx: a statement that fails in the claim's
// transaction (here a division by zero; in a handler, a unique violation)
// aborts it in PostgreSQL. The handler then answers a definitive 4xx: that
// answer is stored and replayed, the handler's writes are not kept.
func testTxFailedStatement4xx(t *testing.T, s idempotency.TxStore) {
	k := newKey(t)
	tx, _ := beginClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	failStatement(t, tx)
	conflict := &idempotency.Response{Status: http.StatusConflict, Header: http.Header{}, Body: []byte(`{"error":"taken"}`)}
	if err := tx.Commit(t.Context(), conflict, Long); err != nil {
		t.Fatalf("Commit of a 409 after a failed statement: %v, want it stored", err)
	}
	got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	sameResponse(t, got.Response, conflict)
}

// testTxFailedStatementSuccess: a success over an aborted transaction
// would be a success without its writes: ErrTxAborted, and nothing is
// left, so the key is free.
func testTxFailedStatementSuccess(t *testing.T, s idempotency.TxStore) {
	k := newKey(t)
	tx, _ := beginClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	failStatement(t, tx)
	if err := tx.Commit(t.Context(), sampleResponse(), Long); !errors.Is(err, idempotency.ErrTxAborted) {
		t.Fatalf("Commit of a 201 after a failed statement: %v, want ErrTxAborted", err)
	}
	mustClaim(t, s, claimOf(k, fp("b"), Long, Long), idempotency.OutcomeClaimed)
}

// failStatement runs a statement that fails in the claim's transaction,
// through the handler's view of it (a pgx.Tx, or a SQLStore's *sql.Tx).
func failStatement(t *testing.T, tx *idempotency.ClaimTx) {
	t.Helper()
	var err error
	if stx := tx.SQLTx(); stx != nil {
		_, err = stx.ExecContext(t.Context(), "SELECT 1/0")
	} else {
		_, err = tx.Tx().Exec(t.Context(), "SELECT 1/0")
	}
	if err == nil {
		t.Fatal("SELECT 1/0 succeeded")
	}
}
