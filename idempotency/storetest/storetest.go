// Package storetest is the conformance suite every idempotency.Store must
// pass: claim, in-progress, mismatch, complete and replay, release, lease
// expiry and takeover, fencing, lease renewal, retention expiry and purge,
// with real concurrency (many goroutines claiming one key: exactly one
// winner; racing claims against a renewing owner: no winner).
//
// Usage:
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) idempotency.Store { return newMyStore(t) })
//	}
//
// # What it checks
//
// The contract a store must keep, beyond each method's doc:
//
//   - Leases and retentions are measured in the store's own clock, from the
//     moment it handles the call: the middleware reckons its handler's
//     deadline from when it sent the call, which only works if the store
//     never starts a lease earlier than that.
//   - A fence is the token of one claim. Fences of a key strictly increase.
//     Complete, Release and Renew succeed only for the current fence, and
//     only while the claim stands; otherwise they return
//     idempotency.ErrFenced.
//   - Retention ends in the store's clock too. A store whose storage
//     deletes expired records by itself (Redis key expiry) says so with
//     SelfExpiring; its Purge then has nothing to do.
//   - Renew extends a live lease by its lease from the store's now, and the
//     record's retention to at least the same end. It never brings back a
//     lease that has run out, even if nobody took the key over: the
//     owner's handler has been stopped by then, and a renewal would let a
//     stopped handler's key block retries.
//
// Call Run from a test of the store's package:
//
//	func TestStore(t *testing.T) {
//		storetest.RunTx(t, func(t *testing.T) idempotency.TxStore {
//			return idempotency.NewPostgresStore(testdb.New(t).Pool)
//		})
//	}
//
// A TxStore (one that also claims inside a transaction, for
// ModeTransactional) runs RunTx instead, which adds the transactional claim:
// commit, rollback, and racing transactional claims that must answer
// in-progress without waiting for the winner's open transaction.
//
// newStore is called once per subtest and must return an empty store of
// its own; subtests run in parallel. Leases and retentions are short real
// durations (a few seconds) measured in the store's own clock, and every
// wait is a poll with a deadline, never a fixed sleep, so the suite takes a
// few seconds and tolerates a slow machine. What it cannot prove: durability
// across a process crash (that is the PostgreSQL store's own test) and
// behaviour under clock jumps.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// Durations the suite uses.
const (
	// Lease is the short lease of claims that a subtest lets run out.
	Lease = 3 * time.Second
	// Long is a lease or retention that never runs out during a test.
	Long = time.Hour
	// Retention is the short retention of records a subtest lets expire.
	Retention = 3 * time.Second
	// WaitTimeout bounds every poll for a lease or retention to run out.
	WaitTimeout = 20 * time.Second
	// Racers is how many goroutines race on one key.
	Racers = 50
)

// Run runs the suite against the stores newStore returns.
func Run(t *testing.T, newStore func(t *testing.T) idempotency.Store) {
	t.Helper()
	for _, tt := range []struct {
		name string
		fn   func(t *testing.T, s idempotency.Store)
	}{
		{"ClaimNewKey", testClaimNewKey},
		{"DistinctKeysIndependent", testDistinctKeys},
		{"InProgressWhileLeased", testInProgress},
		{"MismatchWinsOverInProgress", testMismatchWinsOverInProgress},
		{"CompleteThenReplay", testCompleteThenReplay},
		{"ReplayEmptyBody", testReplayEmptyBody},
		{"ReplayIsACopy", testReplayIsACopy},
		{"MismatchAfterComplete", testMismatchAfterComplete},
		{"CompleteWithStaleFence", testCompleteStaleFence},
		{"CompleteTwice", testCompleteTwice},
		{"ReleaseThenReclaim", testReleaseThenReclaim},
		{"LeaseExpiryTakeover", testLeaseExpiryTakeover},
		{"ConcurrentClaimsOneWinner", testConcurrentClaims},
		{"ConcurrentTakeoverOneWinner", testConcurrentTakeover},
		{"RetentionExpiry", testRetentionExpiry},
		{"CompleteRetentionCountsFromCompletion", testCompleteRetention},
		{"Purge", testPurge},
		{"CancelledContext", testCancelledContext},
		{"RenewKeepsKeyPastLease", testRenewKeepsKey},
		{"RenewFencedByToken", testRenewFenced},
		{"RenewAfterLeaseRanOut", testRenewAfterExpiry},
		{"RenewExtendsRetention", testRenewExtendsRetention},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newStore(t))
		})
	}
}

func newKey(t *testing.T) idempotency.KeyHash {
	t.Helper()
	var k idempotency.KeyHash
	if _, err := rand.Read(k[:]); err != nil {
		t.Fatal(err)
	}
	return k
}

func fp(s string) idempotency.Fingerprint { return sha256.Sum256([]byte(s)) }

func claimOf(k idempotency.KeyHash, f idempotency.Fingerprint, lease, retention time.Duration) idempotency.Claim {
	return idempotency.Claim{Key: k, Fingerprint: f, Lease: lease, Retention: retention}
}

func mustClaim(t *testing.T, s idempotency.Store, c idempotency.Claim, want idempotency.Outcome) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), c)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if res.Outcome != want {
		t.Fatalf("Claim outcome %s, want %s", res.Outcome, want)
	}
	switch want {
	case idempotency.OutcomeClaimed, idempotency.OutcomeTookOver:
		if res.Fence <= 0 {
			t.Fatalf("%s with fence %d, want a positive fence", want, res.Fence)
		}
	case idempotency.OutcomeCompleted:
		if res.Response == nil {
			t.Fatal("completed without a response")
		}
	}
	return res
}

// eventually polls f until it returns true or WaitTimeout passes. It is how
// the suite waits for a lease or retention to run out in the store's clock.
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s did not happen", WaitTimeout, what)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-tick.C:
		}
	}
}

func sampleResponse() *idempotency.Response {
	return &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/charges/1"},
			"X-Multi":      {"a", "b"},
		},
		// Not valid UTF-8 on purpose: the body is bytes.
		Body: []byte("{\"id\":1}\x00\xff\n"),
	}
}

func sameResponse(t *testing.T, got, want *idempotency.Response) {
	t.Helper()
	if got == nil {
		t.Fatal("no response")
	}
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("replayed %d %q, want %d %q", got.Status, got.Body, want.Status, want.Body)
	}
	for k, v := range want.Header {
		g := got.Header.Values(k)
		if len(g) != len(v) {
			t.Fatalf("replayed header %s = %q, want %q", k, g, v)
		}
		for i := range v {
			if g[i] != v[i] {
				t.Fatalf("replayed header %s = %q, want %q", k, g, v)
			}
		}
	}
}

func testClaimNewKey(t *testing.T, s idempotency.Store) {
	mustClaim(t, s, claimOf(newKey(t), fp("a"), Long, Long), idempotency.OutcomeClaimed)
}

func testDistinctKeys(t *testing.T, s idempotency.Store) {
	k1, k2 := newKey(t), newKey(t)
	r1 := mustClaim(t, s, claimOf(k1, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	mustClaim(t, s, claimOf(k2, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	if err := s.Complete(t.Context(), k1, r1.Fence, sampleResponse(), Long); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, claimOf(k1, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	mustClaim(t, s, claimOf(k2, fp("a"), Long, Long), idempotency.OutcomeInProgress)
}

func testInProgress(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	res := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeInProgress)
	if res.RetryAfter <= 0 || res.RetryAfter > Long {
		t.Fatalf("RetryAfter %s, want in (0, %s]: what is left of the lease", res.RetryAfter, Long)
	}
	if res.Fence != 0 || res.Response != nil {
		t.Fatalf("in-progress result carries a fence or response: %+v", res)
	}
}

func testMismatchWinsOverInProgress(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	mustClaim(t, s, claimOf(k, fp("b"), Long, Long), idempotency.OutcomeMismatch)
}

func testCompleteThenReplay(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	want := sampleResponse()
	if err := s.Complete(t.Context(), k, r.Fence, want, Long); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
		sameResponse(t, got.Response, sampleResponse())
		expiresWithin(t, got, Long)
	}
}

// expiresWithin checks ExpiresIn of a completed result: unknown (0) or what
// is left of a retention of at most max. Too long would let a cache replay
// a record past its expiry.
func expiresWithin(t *testing.T, res idempotency.ClaimResult, max time.Duration) {
	t.Helper()
	if res.ExpiresIn < 0 || res.ExpiresIn > max {
		t.Fatalf("completed with ExpiresIn %s, want 0 (unknown) or in (0, %s]", res.ExpiresIn, max)
	}
}

func testReplayEmptyBody(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	if err := s.Complete(t.Context(), k, r.Fence, &idempotency.Response{Status: http.StatusNoContent}, Long); err != nil {
		t.Fatal(err)
	}
	got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	if got.Response.Status != http.StatusNoContent || len(got.Response.Body) != 0 {
		t.Fatalf("replayed %d with %d body bytes, want 204 and none", got.Response.Status, len(got.Response.Body))
	}
}

// testReplayIsACopy: a caller that changes what it got (or what it stored)
// must not change what the next replay returns.
func testReplayIsACopy(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	stored := sampleResponse()
	if err := s.Complete(t.Context(), k, r.Fence, stored, Long); err != nil {
		t.Fatal(err)
	}
	stored.Body[0] = 'X'
	stored.Header.Set("Location", "/elsewhere")
	got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	sameResponse(t, got.Response, sampleResponse())
	got.Response.Body[0] = 'Y'
	got.Response.Header.Set("Location", "/elsewhere")
	again := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	sameResponse(t, again.Response, sampleResponse())
}

func testMismatchAfterComplete(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	if err := s.Complete(t.Context(), k, r.Fence, sampleResponse(), Long); err != nil {
		t.Fatal(err)
	}
	res := mustClaim(t, s, claimOf(k, fp("b"), Long, Long), idempotency.OutcomeMismatch)
	if res.Response != nil {
		t.Fatal("a mismatch carries the stored response: it must never leak to a different request")
	}
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
}

func testCompleteStaleFence(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	for _, bad := range []int64{r.Fence + 1, r.Fence - 1, 0} {
		if err := s.Complete(t.Context(), k, bad, sampleResponse(), Long); !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("Complete with fence %d (owner %d): %v, want ErrFenced", bad, r.Fence, err)
		}
		if err := s.Release(t.Context(), k, bad); !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("Release with fence %d (owner %d): %v, want ErrFenced", bad, r.Fence, err)
		}
	}
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeInProgress)
	// A key nobody claimed cannot be completed either.
	if err := s.Complete(t.Context(), newKey(t), 1, sampleResponse(), Long); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("Complete of an unclaimed key: %v, want ErrFenced", err)
	}
}

// testCompleteTwice: a second completion never replaces the stored answer.
func testCompleteTwice(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	if err := s.Complete(t.Context(), k, r.Fence, sampleResponse(), Long); err != nil {
		t.Fatal(err)
	}
	other := &idempotency.Response{Status: http.StatusAccepted, Body: []byte("other")}
	if err := s.Complete(t.Context(), k, r.Fence, other, Long); err != nil && !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("second Complete: %v, want nil or ErrFenced", err)
	}
	got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	sameResponse(t, got.Response, sampleResponse())
	if err := s.Release(t.Context(), k, r.Fence); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("Release of a completed key: %v, want ErrFenced (a stored answer is never given up)", err)
	}
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
}

func testReleaseThenReclaim(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	fences := []int64{mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed).Fence}
	for range 2 {
		last := fences[len(fences)-1]
		if err := s.Release(t.Context(), k, last); err != nil {
			t.Fatalf("Release: %v", err)
		}
		// Released: the next request runs at once, no lease to wait out.
		r := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
		if r.Fence <= last {
			t.Fatalf("fence after release %d, want > %d (fences strictly increase)", r.Fence, last)
		}
		// The released owner is fenced out of the new claim.
		if err := s.Complete(t.Context(), k, last, sampleResponse(), Long); !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("Complete by the released owner: %v, want ErrFenced", err)
		}
		if err := s.Release(t.Context(), k, last); !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("second Release by the released owner: %v, want ErrFenced", err)
		}
		fences = append(fences, r.Fence)
	}
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeInProgress)
}

// testLeaseExpiryTakeover is the crash story of two-step mode:
//  1. owner A claims with a short lease and "crashes" (never completes);
//  2. until the lease runs out, a retry gets in-progress; a different
//     request gets mismatch, even after the lease ran out;
//  3. after the lease, the retry takes over with a higher fence;
//  4. A wakes up late: its Complete and Release are fenced out;
//  5. the new owner's response is what replays.
func testLeaseExpiryTakeover(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	a := mustClaim(t, s, claimOf(k, fp("a"), Lease, Long), idempotency.OutcomeClaimed)
	mustClaim(t, s, claimOf(k, fp("a"), Lease, Long), idempotency.OutcomeInProgress)
	var b idempotency.ClaimResult
	eventually(t, "takeover after the lease", func() bool {
		res, err := s.Claim(t.Context(), claimOf(k, fp("a"), Long, Long))
		if err != nil {
			t.Fatal(err)
		}
		switch res.Outcome {
		case idempotency.OutcomeInProgress:
			return false
		case idempotency.OutcomeTookOver:
			b = res
			return true
		}
		t.Fatalf("claim of a leased key: %s, want in_progress then took_over", res.Outcome)
		return false
	})
	if b.Fence <= a.Fence {
		t.Fatalf("takeover fence %d, want > %d", b.Fence, a.Fence)
	}
	mustClaim(t, s, claimOf(k, fp("other"), Long, Long), idempotency.OutcomeMismatch)
	if err := s.Complete(t.Context(), k, a.Fence, &idempotency.Response{Status: 500, Body: []byte("late")}, Long); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("late Complete by the old owner: %v, want ErrFenced", err)
	}
	if err := s.Release(t.Context(), k, a.Fence); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("late Release by the old owner: %v, want ErrFenced", err)
	}
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeInProgress)
	if err := s.Complete(t.Context(), k, b.Fence, sampleResponse(), Long); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
	got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	sameResponse(t, got.Response, sampleResponse())
}

// race runs Racers claims of c at once and counts the outcomes.
func race(t *testing.T, s idempotency.Store, c idempotency.Claim) (map[idempotency.Outcome]int, []int64) {
	t.Helper()
	start := make(chan struct{})
	var (
		mu     sync.Mutex
		counts = map[idempotency.Outcome]int{}
		fences []int64
		errs   []error
		wg     sync.WaitGroup
	)
	for range Racers {
		wg.Go(func() {
			<-start
			res, err := s.Claim(context.WithoutCancel(t.Context()), c)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			counts[res.Outcome]++
			if res.Fence != 0 {
				fences = append(fences, res.Fence)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d racing claims failed, first: %v", len(errs), Racers, errs[0])
	}
	return counts, fences
}

func testConcurrentClaims(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	counts, fences := race(t, s, claimOf(k, fp("a"), Long, Long))
	if counts[idempotency.OutcomeClaimed] != 1 || counts[idempotency.OutcomeInProgress] != Racers-1 || len(fences) != 1 {
		t.Fatalf("%d racing claims of one new key: %v (%d fences), want exactly 1 claimed and %d in progress", Racers, counts, len(fences), Racers-1)
	}
	if err := s.Complete(t.Context(), k, fences[0], sampleResponse(), Long); err != nil {
		t.Fatalf("the winner's Complete: %v", err)
	}
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
}

// testConcurrentTakeover: when a lease runs out, many retries race to take
// it over and exactly one wins. A probe key claimed after the raced key
// with the same lease tells, without a sleep, that the raced key's lease
// has run out too.
func testConcurrentTakeover(t *testing.T, s idempotency.Store) {
	k, probe := newKey(t), newKey(t)
	old := mustClaim(t, s, claimOf(k, fp("a"), Lease, Long), idempotency.OutcomeClaimed)
	mustClaim(t, s, claimOf(probe, fp("p"), Lease, Long), idempotency.OutcomeClaimed)
	eventually(t, "the probe's lease to run out", func() bool {
		res, err := s.Claim(t.Context(), claimOf(probe, fp("p"), Long, Long))
		if err != nil {
			t.Fatal(err)
		}
		return res.Outcome == idempotency.OutcomeTookOver
	})
	counts, fences := race(t, s, claimOf(k, fp("a"), Long, Long))
	if counts[idempotency.OutcomeTookOver] != 1 || counts[idempotency.OutcomeInProgress] != Racers-1 || len(fences) != 1 {
		t.Fatalf("%d racing claims of an expired lease: %v, want exactly 1 took_over and %d in progress", Racers, counts, Racers-1)
	}
	if fences[0] <= old.Fence {
		t.Fatalf("takeover fence %d, want > %d", fences[0], old.Fence)
	}
}

// testRetentionExpiry: once its retention has passed, a key is free again,
// even for a different request, and the claim is a fresh one.
func testRetentionExpiry(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Retention), idempotency.OutcomeClaimed)
	if err := s.Complete(t.Context(), k, r.Fence, sampleResponse(), Retention); err != nil {
		t.Fatal(err)
	}
	expiresWithin(t, mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted), Retention)
	var fresh idempotency.ClaimResult
	eventually(t, "the key to expire", func() bool {
		res, err := s.Claim(t.Context(), claimOf(k, fp("b"), Long, Long))
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome == idempotency.OutcomeMismatch {
			return false
		}
		fresh = res
		return true
	})
	if fresh.Outcome != idempotency.OutcomeClaimed || fresh.Fence <= r.Fence {
		t.Fatalf("claim of an expired key: %s fence %d, want claimed with a fence > %d", fresh.Outcome, fresh.Fence, r.Fence)
	}
}

// testCompleteRetention: Complete keeps the record for its retention from
// the completion, whatever the claim said. A probe key with the short
// retention tells when the claim's retention would have ended.
func testCompleteRetention(t *testing.T, s idempotency.Store) {
	k, probe := newKey(t), newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Retention), idempotency.OutcomeClaimed)
	if err := s.Complete(t.Context(), k, r.Fence, sampleResponse(), Long); err != nil {
		t.Fatal(err)
	}
	p := mustClaim(t, s, claimOf(probe, fp("p"), Long, Retention), idempotency.OutcomeClaimed)
	if err := s.Complete(t.Context(), probe, p.Fence, sampleResponse(), Retention); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the probe to expire", func() bool {
		res, err := s.Claim(t.Context(), claimOf(probe, fp("q"), Long, Long))
		if err != nil {
			t.Fatal(err)
		}
		return res.Outcome == idempotency.OutcomeClaimed
	})
	got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	sameResponse(t, got.Response, sampleResponse())
	if got.ExpiresIn != 0 && got.ExpiresIn <= Retention {
		t.Fatalf("ExpiresIn %s: counted from the claim's retention, not the completion's %s", got.ExpiresIn, Long)
	}
}

// SelfExpiring is implemented by a Store whose storage deletes a record
// by itself when its retention ends (Redis key expiry), so that Purge finds
// nothing to delete. For such a store the Purge subtest checks, instead of
// Purge's count, that the expired records are gone (their keys are free
// for a different request) and that Purge deletes nothing live. Whether
// the storage really frees the memory is the store's own test to prove.
type SelfExpiring interface {
	RecordsExpireThemselves() bool
}

func selfExpiring(s idempotency.Store) bool {
	se, ok := s.(SelfExpiring)
	return ok && se.RecordsExpireThemselves()
}

// testPurge: expired records go in batches of at most limit; live ones
// (completed within retention, or claimed under a live lease) stay.
func testPurge(t *testing.T, s idempotency.Store) {
	const expired, limit = 5, 2
	var keys []idempotency.KeyHash
	for range expired {
		k := newKey(t)
		keys = append(keys, k)
		r := mustClaim(t, s, claimOf(k, fp("a"), Long, Retention), idempotency.OutcomeClaimed)
		if err := s.Complete(t.Context(), k, r.Fence, sampleResponse(), Retention); err != nil {
			t.Fatal(err)
		}
	}
	live := newKey(t)
	r := mustClaim(t, s, claimOf(live, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	if err := s.Complete(t.Context(), live, r.Fence, sampleResponse(), Long); err != nil {
		t.Fatal(err)
	}
	leased := newKey(t)
	mustClaim(t, s, claimOf(leased, fp("a"), Long, Long), idempotency.OutcomeClaimed)

	if selfExpiring(s) {
		for _, k := range keys {
			eventually(t, "an expired record to be gone", func() bool {
				res, err := s.Claim(t.Context(), claimOf(k, fp("b"), Long, Long))
				if err != nil {
					t.Fatal(err)
				}
				switch res.Outcome {
				case idempotency.OutcomeMismatch:
					return false
				case idempotency.OutcomeClaimed:
					return true
				}
				t.Fatalf("claim of an expired key by a different request: %s, want mismatch then claimed", res.Outcome)
				return false
			})
		}
		if n, err := s.Purge(t.Context(), limit); err != nil || n < 0 || n > limit {
			t.Fatalf("Purge(%d) of a self-expiring store: %d, %v", limit, n, err)
		}
		mustClaim(t, s, claimOf(live, fp("a"), Long, Long), idempotency.OutcomeCompleted)
		mustClaim(t, s, claimOf(leased, fp("a"), Long, Long), idempotency.OutcomeInProgress)
		return
	}
	purged := 0
	eventually(t, "the expired records to be purged", func() bool {
		n, err := s.Purge(t.Context(), limit)
		if err != nil {
			t.Fatal(err)
		}
		if n < 0 || n > limit {
			t.Fatalf("Purge(%d) deleted %d", limit, n)
		}
		purged += n
		return purged >= expired
	})
	if purged != expired {
		t.Fatalf("purged %d records, want %d", purged, expired)
	}
	if n, err := s.Purge(t.Context(), limit); err != nil || n != 0 {
		t.Fatalf("Purge after everything expired was gone: %d, %v; want 0", n, err)
	}
	mustClaim(t, s, claimOf(live, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	mustClaim(t, s, claimOf(leased, fp("a"), Long, Long), idempotency.OutcomeInProgress)
}

func testCancelledContext(t *testing.T, s idempotency.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	k := newKey(t)
	if _, err := s.Claim(ctx, claimOf(k, fp("a"), Long, Long)); err == nil {
		t.Fatal("Claim with a cancelled context succeeded")
	}
	// Nothing was claimed by the cancelled call.
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
}

// testRenewKeepsKey: an owner that renews every Lease/3 keeps its key past
// its first lease: racing claims after that lease would have run out (a
// probe claimed with the same lease just after has been taken over) all
// get in-progress. When the owner stops renewing, the lease runs out and
// exactly one racer takes over; the owner's next renewal is fenced.
func testRenewKeepsKey(t *testing.T, s idempotency.Store) {
	k, probe := newKey(t), newKey(t)
	own := mustClaim(t, s, claimOf(k, fp("a"), Lease, Long), idempotency.OutcomeClaimed)
	mustClaim(t, s, claimOf(probe, fp("p"), Lease, Long), idempotency.OutcomeClaimed)
	stop, stopped := make(chan struct{}), make(chan error, 1)
	var once sync.Once
	stopRenewing := func() error {
		once.Do(func() { close(stop) })
		err := <-stopped
		stopped <- err
		return err
	}
	t.Cleanup(func() { _ = stopRenewing() })
	go func() {
		tick := time.NewTicker(Lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				stopped <- nil
				return
			case <-tick.C:
			}
			if err := s.Renew(context.WithoutCancel(t.Context()), k, own.Fence, Lease); err != nil {
				stopped <- err
				return
			}
		}
	}()
	eventually(t, "the probe's lease to run out", func() bool {
		res, err := s.Claim(t.Context(), claimOf(probe, fp("p"), Long, Long))
		if err != nil {
			t.Fatal(err)
		}
		return res.Outcome == idempotency.OutcomeTookOver
	})
	counts, _ := race(t, s, claimOf(k, fp("a"), Long, Long))
	if err := stopRenewing(); err != nil {
		t.Fatalf("the owner's renewal failed: %v", err)
	}
	if counts[idempotency.OutcomeInProgress] != Racers {
		t.Fatalf("%d racing claims past the first lease of a renewed claim: %v, want all in progress", Racers, counts)
	}
	var took idempotency.ClaimResult
	eventually(t, "the unrenewed lease to run out", func() bool {
		res, err := s.Claim(t.Context(), claimOf(k, fp("a"), Long, Long))
		if err != nil {
			t.Fatal(err)
		}
		took = res
		return res.Outcome != idempotency.OutcomeInProgress
	})
	if took.Outcome != idempotency.OutcomeTookOver || took.Fence <= own.Fence {
		t.Fatalf("after the renewals stopped: %s fence %d, want took_over with a fence > %d", took.Outcome, took.Fence, own.Fence)
	}
	if err := s.Renew(t.Context(), k, own.Fence, Lease); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("Renew by the old owner after a takeover: %v, want ErrFenced", err)
	}
	if err := s.Renew(t.Context(), k, took.Fence, Long); err != nil {
		t.Fatalf("Renew by the new owner: %v", err)
	}
}

// testRenewFenced: only the current fence renews, and only a standing
// claim.
func testRenewFenced(t *testing.T, s idempotency.Store) {
	k := newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	for _, bad := range []int64{r.Fence + 1, r.Fence - 1, 0} {
		if err := s.Renew(t.Context(), k, bad, Long); !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("Renew with fence %d (owner %d): %v, want ErrFenced", bad, r.Fence, err)
		}
	}
	if err := s.Renew(t.Context(), k, r.Fence, Long); err != nil {
		t.Fatalf("Renew by the owner: %v", err)
	}
	if err := s.Renew(t.Context(), newKey(t), 1, Long); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("Renew of an unclaimed key: %v, want ErrFenced", err)
	}
	if err := s.Complete(t.Context(), k, r.Fence, sampleResponse(), Long); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(t.Context(), k, r.Fence, Long); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("Renew of a completed key: %v, want ErrFenced", err)
	}
	got := mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeCompleted)
	sameResponse(t, got.Response, sampleResponse())

	k2 := newKey(t)
	r2 := mustClaim(t, s, claimOf(k2, fp("a"), Long, Long), idempotency.OutcomeClaimed)
	if err := s.Release(t.Context(), k2, r2.Fence); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(t.Context(), k2, r2.Fence, Long); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("Renew of a released key: %v, want ErrFenced", err)
	}
	mustClaim(t, s, claimOf(k2, fp("a"), Long, Long), idempotency.OutcomeClaimed)
}

// testRenewAfterExpiry: a lease that ran out in the store's clock is not
// renewed, although nobody took the key over; the next claim takes over.
// A probe claimed just after with the same lease tells when it ran out.
func testRenewAfterExpiry(t *testing.T, s idempotency.Store) {
	k, probe := newKey(t), newKey(t)
	r := mustClaim(t, s, claimOf(k, fp("a"), Lease, Long), idempotency.OutcomeClaimed)
	mustClaim(t, s, claimOf(probe, fp("p"), Lease, Long), idempotency.OutcomeClaimed)
	eventually(t, "the probe's lease to run out", func() bool {
		res, err := s.Claim(t.Context(), claimOf(probe, fp("p"), Long, Long))
		if err != nil {
			t.Fatal(err)
		}
		return res.Outcome == idempotency.OutcomeTookOver
	})
	if err := s.Renew(t.Context(), k, r.Fence, Long); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("Renew of a lease that ran out: %v, want ErrFenced", err)
	}
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeTookOver)
}

// testRenewExtendsRetention: a claim renewed past its record's retention
// keeps the record: a different request still gets mismatch, not the key.
// A probe record with the same retention tells when it would have expired.
func testRenewExtendsRetention(t *testing.T, s idempotency.Store) {
	k, probe := newKey(t), newKey(t)
	own := mustClaim(t, s, claimOf(k, fp("a"), Retention, Retention), idempotency.OutcomeClaimed)
	p := mustClaim(t, s, claimOf(probe, fp("p"), Long, Retention), idempotency.OutcomeClaimed)
	if err := s.Complete(t.Context(), probe, p.Fence, sampleResponse(), Retention); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the probe to expire", func() bool {
		if err := s.Renew(t.Context(), k, own.Fence, Retention); err != nil {
			t.Fatalf("Renew of a live claim: %v", err)
		}
		res, err := s.Claim(t.Context(), claimOf(probe, fp("q"), Long, Long))
		if err != nil {
			t.Fatal(err)
		}
		return res.Outcome == idempotency.OutcomeClaimed
	})
	if err := s.Renew(t.Context(), k, own.Fence, Retention); err != nil {
		t.Fatalf("Renew past the first retention: %v", err)
	}
	mustClaim(t, s, claimOf(k, fp("other"), Long, Long), idempotency.OutcomeMismatch)
	mustClaim(t, s, claimOf(k, fp("a"), Long, Long), idempotency.OutcomeInProgress)
}
