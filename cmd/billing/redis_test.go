package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemtest"
)

// testRedis is the shared Redis of the tests (.ci/run starts it) and a key
// prefix of the test's own, whose keys are deleted when the test ends. An
// unreachable server fails the test.
func testRedis(t *testing.T) (url string, c *redis.Client, prefix string) {
	t.Helper()
	addr := os.Getenv("TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix = "{billingtest-" + hex.EncodeToString(b[:]) + "}:"
	c = redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		t.Fatalf("redis at %s is unreachable (.ci/run starts one): %v", addr, err)
	}
	t.Cleanup(func() {
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if keys, err := c.Keys(ctx, prefix+"*").Result(); err == nil && len(keys) > 0 {
			_ = c.Del(ctx, keys...).Err()
		}
	})
	return "redis://" + addr + "/0?prefix=" + prefix, c, prefix
}

func TestServeIdempotencyStoreBadInput(t *testing.T) {
	t.Parallel()
	base := []string{"KAFKA_BROKERS=127.0.0.1:1", "PAYMENT_URL=http://127.0.0.1:1"}
	testCases := []struct {
		name     string
		store    string
		wantCode int
		wantErr  string
	}{
		{"unknown store", "mongodb://h/db", 2, "IDEMPOTENCY_STORE"},
		{"unknown word", "memory", 2, "want postgres, redis (REDIS_URL) or a redis:// URL"},
		{"bad database", "redis://127.0.0.1:6379/zero", 2, "invalid Redis URL"},
		{"bad option, password hidden", "redis://:hunter2pass@127.0.0.1:6379/0?dial_timeout=hunter2pass", 2, "invalid Redis URL"},
		{"unreachable", "redis://127.0.0.1:1/0?dial_timeout=1s", 1, "unreachable"},
	}
	if stdout, _, code := runBilling(t, nil, "serve", "--help"); code != 0 || !strings.Contains(stdout, "IDEMPOTENCY_STORE") {
		t.Errorf("serve --help: exit %d, no IDEMPOTENCY_STORE in %q", code, stdout)
	}
	// "redis" takes REDIS_URL.
	_, stderr, code := runBilling(t, append(base, "IDEMPOTENCY_STORE=redis", "REDIS_URL=redis://127.0.0.1:6379/zero"), "serve")
	if code != 2 || !strings.Contains(stderr, "invalid Redis URL") {
		t.Errorf("IDEMPOTENCY_STORE=redis with a bad REDIS_URL: exit %d, stderr %q; want 2 and invalid Redis URL", code, stderr)
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, stderr, code := runBilling(t, append(base, "IDEMPOTENCY_STORE="+tt.store), "serve")
			if code != tt.wantCode || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want %d and one line with %q", code, stderr, tt.wantCode, tt.wantErr)
			}
			if strings.Contains(stderr, "hunter2pass") {
				t.Errorf("stderr quotes the password: %q", stderr)
			}
		})
	}
}

// TestServeOnRedisPassesConformance runs the Idempotency-Key conformance
// suite (idemtest, what `idem conformance` runs) against a real `billing
// serve` process whose records are in Redis (IDEMPOTENCY_STORE, two-step
// mode), counting executions in its orders table. Nothing may fail; the
// skips are those of transactional mode (no fault switch, 24h retention).
// The records are in Redis, none in PostgreSQL.
func TestServeOnRedisPassesConformance(t *testing.T) {
	t.Parallel()
	url, rc, prefix := testRedis(t)
	s := newStack(t, nil)
	p := startServe(t, append(s.env, "IDEMPOTENCY_STORE="+url))
	rep, err := idemtest.Run(t.Context(), idemtest.Target{
		URL:        "http://" + p.Addr + "/orders",
		Body:       []byte(`{"customer_id":"c1","total_kopecks":1000}`),
		AltURL:     "http://" + p.Addr + "/payments",
		AltURLBody: []byte(`{"order_id":"ord_none","customer_id":"c1","amount_kopecks":500}`),
		Header:     http.Header{"Authorization": {"Bearer " + aliceToken}},
		PrincipalB: http.Header{"Authorization": {"Bearer bob-token"}},
		Count: func(ctx context.Context) (int64, error) {
			var n int64
			err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return n, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		t.Log(r)
	}
	skipped := slices.DeleteFunc(rep.Names(idemtest.Skip), func(n string) bool { return n == idemtest.CheckRetryAfter })
	if want := []string{idemtest.CheckServerErrorReleased, idemtest.CheckExpiry}; rep.Failed() || !slices.Equal(skipped, want) {
		t.Errorf("failed %v skipped %v, want none failed and %v skipped", rep.Names(idemtest.Fail), rep.Names(idemtest.Skip), want)
	}
	if n := s.count(t, `SELECT count(*) FROM idempotency_key`); n != 0 {
		t.Errorf("%d idempotency records in PostgreSQL, want 0 (they belong in Redis)", n)
	}
	keys, err := rc.Keys(t.Context(), prefix+"*").Result()
	if err != nil || len(keys) < 2 {
		t.Errorf("%d keys under %s in Redis (%v), want the records and the fence counter", len(keys), prefix, err)
	}
	if !strings.Contains(p.stderr.String(), "two-step mode") || !strings.Contains(p.stderr.String(), "appendonly") {
		t.Errorf("no start line naming the Redis store, or no warning about its settings, in stderr:\n%s", p.stderr.String())
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0\n%s", code, p.stderr.String())
	}
}
