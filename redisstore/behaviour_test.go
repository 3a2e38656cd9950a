package redisstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/redisstore"
)

func key(t *testing.T) idempotency.KeyHash {
	t.Helper()
	var k idempotency.KeyHash
	_, _ = rand.Read(k[:])
	return k
}

func claimOf(k idempotency.KeyHash, body string, lease, retention time.Duration) idempotency.Claim {
	return idempotency.Claim{Key: k, Fingerprint: sha256.Sum256([]byte(body)), Lease: lease, Retention: retention}
}

func mustClaim(t *testing.T, s *redisstore.Store, c idempotency.Claim, want idempotency.Outcome) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), c)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if res.Outcome != want {
		t.Fatalf("Claim: %s, want %s", res.Outcome, want)
	}
	return res
}

// waitFor polls cond until it holds, or fails the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 20s", what)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-tick.C:
		}
	}
}

// TestRetentionIsKeyExpiry: the kit sees an expired key as free; this
// proves Redis itself deletes it (the memory comes back), at the
// retention's end in server time, and that a renewal or a completion
// moves the expiry.
func TestRetentionIsKeyExpiry(t *testing.T) {
	t.Parallel()
	su := newSetup(t, nil)
	ctx := t.Context()
	k := key(t)
	r := mustClaim(t, su.store, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeClaimed)
	rk := su.store.RecordKey(k)
	// The expiry is the retention's end rounded up to the millisecond.
	if ttl := su.client.PTTL(ctx, rk).Val(); ttl <= 59*time.Minute || ttl > time.Hour+time.Millisecond {
		t.Fatalf("claimed record's PTTL %s, want the claim's retention (1h)", ttl)
	}
	if err := su.store.Complete(ctx, k, r.Fence, &idempotency.Response{Status: 201, Body: []byte("x")}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if ttl := su.client.PTTL(ctx, rk).Val(); ttl <= 0 || ttl > 2*time.Second+time.Millisecond {
		t.Fatalf("completed record's PTTL %s, want the completion's retention (2s)", ttl)
	}
	waitFor(t, "Redis to delete the expired record", func() bool {
		return su.client.Exists(ctx, rk).Val() == 0
	})
	// The counter stays: it has no expiry.
	if ttl := su.client.PTTL(ctx, su.store.FenceKey()).Val(); ttl != -1 {
		t.Fatalf("fence counter PTTL %s, want none (-1)", ttl)
	}

	// A renewal past the retention moves the expiry to the lease's end.
	k2 := key(t)
	r2 := mustClaim(t, su.store, claimOf(k2, "a", time.Second, time.Second), idempotency.OutcomeClaimed)
	if err := su.store.Renew(ctx, k2, r2.Fence, time.Hour); err != nil {
		t.Fatal(err)
	}
	if ttl := su.client.PTTL(ctx, su.store.RecordKey(k2)).Val(); ttl <= 59*time.Minute {
		t.Fatalf("PTTL after a renewal of 1h: %s", ttl)
	}
}

// TestFencesNeverRepeat: fences grow across a key's expiry (the counter
// outlives records) and even when the counter is lost, as after a restart
// without persistence or a failover: the server's clock is their floor.
func TestFencesNeverRepeat(t *testing.T) {
	t.Parallel()
	su := newSetup(t, nil)
	ctx := t.Context()
	k := key(t)
	first := mustClaim(t, su.store, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeClaimed)
	srv, err := su.client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if first.Fence > srv.UnixMicro() || first.Fence < srv.Add(-time.Minute).UnixMicro() {
		t.Fatalf("fence %d, want the server's clock in microseconds (about %d)", first.Fence, srv.UnixMicro())
	}
	// Record and counter gone: everything a restart without persistence
	// loses.
	if err := su.client.Del(ctx, su.store.RecordKey(k), su.store.FenceKey()).Err(); err != nil {
		t.Fatal(err)
	}
	second := mustClaim(t, su.store, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeClaimed)
	if second.Fence <= first.Fence {
		t.Fatalf("fence after the counter was lost: %d, want > %d", second.Fence, first.Fence)
	}
	if err := su.store.Complete(ctx, k, first.Fence, &idempotency.Response{Status: 201}, time.Hour); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("Complete with the lost record's fence: %v, want ErrFenced", err)
	}
	// A counter set back below a live record's fence (a failover to a
	// stale replica that kept the record): the record's fence is the floor.
	if err := su.client.Set(ctx, su.store.FenceKey(), second.Fence+1<<40, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := su.store.Release(ctx, k, second.Fence); err != nil {
		t.Fatal(err)
	}
	third := mustClaim(t, su.store, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeClaimed)
	if err := su.client.Set(ctx, su.store.FenceKey(), 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := su.store.Release(ctx, k, third.Fence); err != nil {
		t.Fatal(err)
	}
	fourth := mustClaim(t, su.store, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeClaimed)
	if fourth.Fence <= third.Fence {
		t.Fatalf("fence after the counter went back below the record's: %d, want > %d", fourth.Fence, third.Fence)
	}
}

// TestResentCallsAreHarmless: go-redis re-sends a command whose
// connection broke after it was written, so a script may run twice for
// one call. The second run of a claim returns the first's claim (not
// in-progress for its own request), and a completion or release already
// done by the same fence succeeds again without changing anything.
func TestResentCallsAreHarmless(t *testing.T) {
	t.Parallel()
	su := newSetup(t, nil)
	ctx := t.Context()
	k := key(t)
	id := []byte("0123456789abcdef")
	c := claimOf(k, "a", time.Hour, time.Hour)
	first, err := su.store.ClaimWithID(ctx, c, id)
	if err != nil || first.Outcome != idempotency.OutcomeClaimed {
		t.Fatalf("first claim: %+v, %v", first, err)
	}
	again, err := su.store.ClaimWithID(ctx, c, id)
	if err != nil || again.Outcome != idempotency.OutcomeClaimed || again.Fence != first.Fence {
		t.Fatalf("the same claim re-sent: %+v, %v; want claimed with fence %d", again, err, first.Fence)
	}
	// Another call (another id) is another request: in progress.
	mustClaim(t, su.store, c, idempotency.OutcomeInProgress)

	resp := &idempotency.Response{Status: 201, Header: http.Header{"Location": {"/x/1"}}, Body: []byte("one")}
	for range 2 {
		if err := su.store.Complete(ctx, k, first.Fence, resp, time.Hour); err != nil {
			t.Fatalf("Complete (and its re-send): %v", err)
		}
	}
	// A different second completion is refused and changes nothing.
	if err := su.store.Complete(ctx, k, first.Fence, &idempotency.Response{Status: 201, Body: []byte("two")}, time.Hour); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("a different second Complete: %v, want ErrFenced", err)
	}
	got := mustClaim(t, su.store, c, idempotency.OutcomeCompleted)
	if string(got.Response.Body) != "one" || got.Response.Header.Get("Location") != "/x/1" {
		t.Fatalf("replayed %q %v", got.Response.Body, got.Response.Header)
	}
	// After completion the re-sent claim is a replay like any other.
	if res, err := su.store.ClaimWithID(ctx, c, id); err != nil || res.Outcome != idempotency.OutcomeCompleted {
		t.Fatalf("claim re-sent after the completion: %+v, %v; want completed", res, err)
	}

	k2 := key(t)
	r2 := mustClaim(t, su.store, claimOf(k2, "a", time.Hour, time.Hour), idempotency.OutcomeClaimed)
	for range 2 {
		if err := su.store.Release(ctx, k2, r2.Fence); err != nil {
			t.Fatalf("Release (and its re-send): %v", err)
		}
	}
	if err := su.store.Complete(ctx, k2, r2.Fence, resp, time.Hour); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("Complete after Release: %v, want ErrFenced", err)
	}
}

func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	su := newSetup(t, &redisstore.Config{MaxResponseBytes: 1000})
	ctx := t.Context()
	k := key(t)
	r := mustClaim(t, su.store, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeClaimed)
	big := &idempotency.Response{Status: 201, Body: bytes.Repeat([]byte("x"), 1000)}
	err := su.store.Complete(ctx, k, r.Fence, big, time.Hour)
	if !errors.Is(err, redisstore.ErrResponseTooLarge) {
		t.Fatalf("Complete of %d bytes over a 1000-byte limit: %v, want ErrResponseTooLarge", len(big.Body), err)
	}
	// Headers count too.
	hdr := &idempotency.Response{Status: 201, Header: http.Header{"Location": {strings.Repeat("y", 990)}}}
	if err := su.store.Complete(ctx, k, r.Fence, hdr, time.Hour); !errors.Is(err, redisstore.ErrResponseTooLarge) {
		t.Fatalf("Complete with 990 bytes of headers: %v, want ErrResponseTooLarge", err)
	}
	// Nothing was stored; the owner still owns the key.
	mustClaim(t, su.store, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeInProgress)
	if err := su.store.Complete(ctx, k, r.Fence, &idempotency.Response{Status: 201, Body: []byte("small")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, su.store, claimOf(k, "a", time.Hour, time.Hour), idempotency.OutcomeCompleted)

	if _, err := redisstore.New(su.client, &redisstore.Config{MaxResponseBytes: -1}); !errors.Is(err, redisstore.ErrInvalidConfig) {
		t.Fatalf("New with a negative MaxResponseBytes: %v", err)
	}
}

// TestForeignRecords: a key under the prefix that this store did not
// write is an error, never a panic and never a replay.
func TestForeignRecords(t *testing.T) {
	t.Parallel()
	su := newSetup(t, nil)
	ctx := t.Context()
	testCases := []struct {
		name  string
		write func(rk string) error
	}{
		{"string", func(rk string) error { return su.client.Set(ctx, rk, "x", 0).Err() }},
		{"garbage fields", func(rk string) error {
			return su.client.HSet(ctx, rk, "fp", "x", "st", "done", "exp", "nope").Err()
		}},
		{"done without status", func(rk string) error {
			fp := sha256.Sum256([]byte("a"))
			return su.client.HSet(ctx, rk, "fp", fp[:], "st", "done", "exp", "99999999999999999", "body", "b").Err()
		}},
		{"bad headers", func(rk string) error {
			fp := sha256.Sum256([]byte("a"))
			return su.client.HSet(ctx, rk, "fp", fp[:], "st", "done", "exp", "99999999999999999", "status", "201", "hdr", "{", "body", "b").Err()
		}},
		{"claimed with a garbage lease", func(rk string) error {
			fp := sha256.Sum256([]byte("a"))
			return su.client.HSet(ctx, rk, "fp", fp[:], "st", "claimed", "exp", "99999999999999999", "lease", "x").Err()
		}},
		{"unknown state", func(rk string) error {
			fp := sha256.Sum256([]byte("a"))
			return su.client.HSet(ctx, rk, "fp", fp[:], "st", "weird", "exp", "99999999999999999").Err()
		}},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			k := key(t)
			if err := tt.write(su.store.RecordKey(k)); err != nil {
				t.Fatal(err)
			}
			res, err := su.store.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour))
			if err == nil {
				t.Fatalf("Claim of a foreign record: %+v, want an error", res)
			}
			t.Log(err)
			if typ := su.client.Type(ctx, su.store.RecordKey(k)).Val(); typ == "hash" && su.client.HGet(ctx, su.store.RecordKey(k), "cid").Val() != "" {
				t.Fatal("the failed claim overwrote the foreign record")
			}
		})
	}
	// A counter that is not an integer fails the claim before it writes.
	if err := su.client.Set(ctx, su.store.FenceKey(), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	k := key(t)
	if _, err := su.store.Claim(ctx, claimOf(k, "a", time.Hour, time.Hour)); err == nil {
		t.Fatal("Claim with a broken counter succeeded")
	}
	if n := su.client.Exists(ctx, su.store.RecordKey(k)).Val(); n != 0 {
		t.Fatal("a failed claim left a record")
	}
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	su := newSetup(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	k := key(t)
	if err := su.store.Renew(ctx, k, 1, time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Renew: %v", err)
	}
	if err := su.store.Complete(ctx, k, 1, &idempotency.Response{Status: 201}, time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Complete: %v", err)
	}
	if err := su.store.Release(ctx, k, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release: %v", err)
	}
	if _, err := su.store.Purge(ctx, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("Purge: %v", err)
	}
	if _, err := su.store.CheckServer(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("CheckServer: %v", err)
	}
}

func TestNewConfig(t *testing.T) {
	t.Parallel()
	if _, err := redisstore.New(nil, nil); !errors.Is(err, redisstore.ErrInvalidConfig) {
		t.Fatalf("New(nil): %v", err)
	}
	// New does no I/O: a cluster client on addresses nobody listens on is
	// enough to check the prefix rule.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	for _, tt := range []struct {
		prefix string
		ok     bool
	}{
		{"", true}, // the default has a hash tag
		{"{app}:", true},
		{"app:{x}:", true},
		{"app:", false},
		{"app{}:", false},
		{"app}{:", false},
	} {
		_, err := redisstore.New(cc, &redisstore.Config{Prefix: tt.prefix})
		if tt.ok != (err == nil) || err != nil && !errors.Is(err, redisstore.ErrInvalidConfig) {
			t.Errorf("cluster client, Prefix %q: %v", tt.prefix, err)
		}
	}
	// A plain client takes any prefix.
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rc.Close()
	if _, err := redisstore.New(rc, &redisstore.Config{Prefix: "app:"}); err != nil {
		t.Fatal(err)
	}
}
