package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

// Inspect sees what the middleware stored, found by the hash of the
// parts; RequestFingerprint agrees with the middleware's fingerprint.
func TestInspectCompletedKey(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	store := idempotency.NewPostgresStore(db.Pool)
	mw := newMW(t, store, idempotency.Config{})
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	if w := do(h, post("/orders?x=1", "alice", "k1", `{"a": 1, "b": [true]}`)); w.Code != 201 {
		t.Fatalf("status %d", w.Code)
	}
	key := idempotency.HashKey("alice", "POST", "/orders", "k1")
	rec, err := store.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != "completed" || rec.InProgress || rec.ResponseStatus != 201 || rec.ExpiresAt == nil || rec.Expired {
		t.Fatalf("record %+v", rec)
	}
	same, err := idempotency.RequestFingerprint("POST", "/orders?x=1", "application/json", []byte(`{"b":[true],"a":1}`))
	if err != nil || same != rec.Fingerprint {
		t.Errorf("same body (reordered): match=%v, %v", same == rec.Fingerprint, err)
	}
	other, _ := idempotency.RequestFingerprint("POST", "/orders?x=1", "application/json", []byte(`{"a":2}`))
	if other == rec.Fingerprint {
		t.Error("a different body matches")
	}
	if _, err := idempotency.RequestFingerprint("POST", "orders", "", nil); err == nil {
		t.Error("a target without / accepted")
	}
	if _, err := store.Inspect(ctx, idempotency.HashKey("bob", "POST", "/orders", "k1")); !errors.Is(err, idempotency.ErrKeyNotFound) {
		t.Errorf("another principal's key: %v", err)
	}
	if err := store.ForceRelease(ctx, key); !errors.Is(err, idempotency.ErrKeyNotInProgress) {
		t.Errorf("release of a completed key: %v", err)
	}
	if err := store.Forget(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := store.Forget(ctx, key); !errors.Is(err, idempotency.ErrKeyNotFound) {
		t.Errorf("second forget: %v", err)
	}
}

// A stuck two-step claim is freed by ForceRelease: the next request with
// the same fingerprint claims it at once, and the old owner is fenced.
func TestForceReleaseTwoStep(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	store := idempotency.NewPostgresStore(db.Pool)
	key := idempotency.HashKey("alice", "POST", "/orders", "stuck")
	c := idempotency.Claim{Key: key, Fingerprint: fp("body"), Lease: time.Hour, Retention: 24 * time.Hour}
	res, err := store.Claim(ctx, c)
	if err != nil || res.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	rec, err := store.Inspect(ctx, key)
	if err != nil || rec.State != "claimed" || !rec.InProgress || rec.LockedUntil == nil || rec.HolderPID != 0 {
		t.Fatalf("inspect: %+v %v", rec, err)
	}
	if res2, _ := store.Claim(ctx, c); res2.Outcome != idempotency.OutcomeInProgress {
		t.Fatalf("second claim before release: %v", res2.Outcome)
	}
	if err := store.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := store.ForceRelease(ctx, key); !errors.Is(err, idempotency.ErrKeyNotInProgress) {
		t.Errorf("second release: %v", err)
	}
	res3, err := store.Claim(ctx, c)
	if err != nil || res3.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("claim after release: %+v %v", res3, err)
	}
	if err := store.Complete(ctx, key, res.Fence, &idempotency.Response{Status: 201}, time.Hour); !errors.Is(err, idempotency.ErrFenced) {
		t.Errorf("old owner's completion: %v, want ErrFenced", err)
	}
	if err := store.ForceRelease(ctx, idempotency.HashKey("x", "POST", "/", "none")); !errors.Is(err, idempotency.ErrKeyNotFound) {
		t.Errorf("unknown key: %v", err)
	}
}

// A transactional claim has no row until it commits; Inspect finds it by
// its lock and names the backend; ForceRelease refuses it.
func TestInspectTransactionalClaim(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	store := idempotency.NewPostgresStore(db.Pool)
	key := idempotency.HashKey("alice", "POST", "/orders", "tx")
	tx, res, err := store.BeginClaim(ctx, idempotency.Claim{Key: key, Fingerprint: fp("b"), Lease: time.Hour, Retention: time.Hour})
	if err != nil || res.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("begin claim: %+v %v", res, err)
	}
	rec, err := store.Inspect(ctx, key)
	if err != nil || rec.State != "in_transaction" || !rec.InProgress || rec.HolderPID == 0 {
		t.Fatalf("inspect: %+v %v", rec, err)
	}
	if err := store.ForceRelease(ctx, key); !errors.Is(err, idempotency.ErrKeyNotInProgress) {
		t.Errorf("release of a transactional claim: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Inspect(ctx, key); !errors.Is(err, idempotency.ErrKeyNotFound) {
		t.Errorf("after rollback: %v", err)
	}
}
