package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"

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
	op := idempotency.AdminAction{Fence: rec.Fence, Actor: "test", Reason: "test"}
	if err := store.ForceRelease(ctx, key, op); !errors.Is(err, idempotency.ErrKeyNotInProgress) {
		t.Errorf("release of a completed key: %v", err)
	}
	if err := store.Forget(ctx, key, idempotency.AdminAction{Fence: rec.Fence}); !errors.Is(err, idempotency.ErrAuditRequired) {
		t.Errorf("forget without actor and reason: %v", err)
	}
	if err := store.Forget(ctx, key, op); err != nil {
		t.Fatal(err)
	}
	if err := store.Forget(ctx, key, op); !errors.Is(err, idempotency.ErrKeyNotFound) {
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
	op := idempotency.AdminAction{Fence: rec.Fence, Actor: "test", Reason: "test"}
	if err := store.ForceRelease(ctx, key, op); !errors.Is(err, idempotency.ErrLeaseLive) {
		t.Fatalf("release of a live lease without Force: %v", err)
	}
	op.Force = true
	if err := store.ForceRelease(ctx, key, op); err != nil {
		t.Fatal(err)
	}
	if err := store.ForceRelease(ctx, key, op); !errors.Is(err, idempotency.ErrKeyNotInProgress) {
		t.Errorf("second release: %v", err)
	}
	res3, err := store.Claim(ctx, c)
	if err != nil || res3.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("claim after release: %+v %v", res3, err)
	}
	if err := store.Complete(ctx, key, res.Fence, &idempotency.Response{Status: 201}, time.Hour); !errors.Is(err, idempotency.ErrFenced) {
		t.Errorf("old owner's completion: %v, want ErrFenced", err)
	}
	if err := store.ForceRelease(ctx, idempotency.HashKey("x", "POST", "/", "none"), op); !errors.Is(err, idempotency.ErrKeyNotFound) {
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
	if err := store.ForceRelease(ctx, key, idempotency.AdminAction{Fence: 1, Force: true, Actor: "t", Reason: "t"}); !errors.Is(err, idempotency.ErrKeyNotInProgress) {
		t.Errorf("release of a transactional claim: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Inspect(ctx, key); !errors.Is(err, idempotency.ErrKeyNotFound) {
		t.Errorf("after rollback: %v", err)
	}
}

// A retry took over the stuck claim the operator was shown: releasing or
// forgetting with the shown (old) fence refuses and leaves the retry's
// claim alone; with the current fence it acts, and the audit table holds
// one row per action with its actor and reason.
func TestReleaseActsOnlyOnTheClaimShown(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	store := idempotency.NewPostgresStore(db.Pool)
	key := idempotency.HashKey("alice", "POST", "/orders", "stuck")
	c := idempotency.Claim{Key: key, Fingerprint: fp("body"), Lease: time.Millisecond, Retention: time.Hour}
	first, err := store.Claim(ctx, c)
	if err != nil || first.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("claim: %+v %v", first, err)
	}
	shown, err := store.Inspect(ctx, key)
	if err != nil || shown.Fence != first.Fence {
		t.Fatalf("inspect: %+v %v", shown, err)
	}
	// The lease runs out; a retry takes the claim over with a long lease.
	c.Lease = time.Hour
	var retry idempotency.ClaimResult
	for deadline := time.Now().Add(10 * time.Second); retry.Outcome != idempotency.OutcomeTookOver; {
		if time.Now().After(deadline) {
			t.Fatalf("no takeover: %v", retry.Outcome)
		}
		if retry, err = store.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	old := idempotency.AdminAction{Fence: shown.Fence, Force: true, Actor: "alice@ops", Reason: "stuck since the deploy"}
	if err := store.ForceRelease(ctx, key, old); !errors.Is(err, idempotency.ErrClaimChanged) {
		t.Fatalf("release with the old fence: %v, want ErrClaimChanged", err)
	}
	if err := store.Forget(ctx, key, old); !errors.Is(err, idempotency.ErrClaimChanged) {
		t.Fatalf("forget with the old fence: %v, want ErrClaimChanged", err)
	}
	now, err := store.Inspect(ctx, key)
	if err != nil || now.State != "claimed" || !now.InProgress || now.Fence != retry.Fence {
		t.Fatalf("the retry's claim after the refused release: %+v %v", now, err)
	}
	cur := idempotency.AdminAction{Fence: retry.Fence, Actor: "alice@ops", Reason: "the retry hangs too"}
	if err := store.ForceRelease(ctx, key, cur); !errors.Is(err, idempotency.ErrLeaseLive) {
		t.Fatalf("release of the live retry without Force: %v, want ErrLeaseLive", err)
	}
	cur.Force = true
	if err := store.ForceRelease(ctx, key, cur); err != nil {
		t.Fatal(err)
	}
	if err := store.Forget(ctx, key, cur); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT action, subject, actor, reason, (detail->>'fence')::bigint FROM idem_admin_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		action, subject, actor, reason string
		fence                          int64
	}
	var got []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.action, &r.subject, &r.actor, &r.reason, &r.fence); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sub := idempotency.KeyHashHex(key)
	want := []row{{"keys.release", sub, "alice@ops", "the retry hangs too", retry.Fence}, {"keys.forget", sub, "alice@ops", "the retry hangs too", retry.Fence}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("audit rows %+v, want %+v", got, want)
	}
}

// Forget reaches every instance: two middleware instances on one
// database both replay a completed key (each from its own cache after the
// first); once an operator forgets it, each runs the handler again within
// ReplayCacheTTL, instead of replaying the forgotten answer for the
// record's 24h retention.
func TestForgetReachesEveryInstance(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	store := idempotency.NewPostgresStore(db.Pool)
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		fmt.Fprintf(w, "run %d", runs.Add(1))
	})
	a := newMW(t, idempotency.NewPostgresStore(db.Pool), idempotency.Config{}).Wrap(h)
	b := newMW(t, idempotency.NewPostgresStore(db.Pool), idempotency.Config{}).Wrap(h)
	if w := do(a, post("/orders", "alice", "k", `{}`)); w.Body.String() != "run 1" {
		t.Fatalf("first: %d %q", w.Code, w.Body)
	}
	for range 2 { // the second replay of each comes from its cache
		for _, inst := range []http.Handler{a, b} {
			if w := do(inst, post("/orders", "alice", "k", `{}`)); w.Body.String() != "run 1" || w.Header().Get(idem.HeaderReplayed) != "true" {
				t.Fatalf("replay: %d %q", w.Code, w.Body)
			}
		}
	}
	key := idempotency.HashKey("alice", "POST", "/orders", "k")
	rec, err := store.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Forget(ctx, key, idempotency.AdminAction{Fence: rec.Fence, Actor: "t", Reason: "a bug stored it"}); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i, inst := range []http.Handler{a, b} {
		deadline := time.Now().Add(idempotency.ReplayCacheTTLDefault + 10*time.Second)
		for {
			w := do(inst, post("/orders", "alice", "k", `{}`))
			if w.Header().Get(idem.HeaderReplayed) != "true" && w.Code == 201 {
				break // ran the handler (or, for b, replayed what a's run stored: below)
			}
			if w.Body.String() != "run 1" && w.Header().Get(idem.HeaderReplayed) == "true" {
				break // b replays the answer of a's new run, not the forgotten one
			}
			if time.Now().After(deadline) {
				t.Fatalf("instance %d still replays the forgotten answer %q after %s", i, w.Body, idempotency.ReplayCacheTTLDefault+10*time.Second)
			}
			<-tick.C
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (once before forget, once after)", n)
	}
}
