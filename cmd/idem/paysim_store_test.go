package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/paysim"
)

// testRedisAddr is the shared Redis of the tests (.ci/run starts it).
func testRedisAddr() string {
	if a := os.Getenv("TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// redisTestURL is a redis:// URL with a key prefix of the test's own,
// whose keys are deleted when the test ends. An unreachable server fails
// the test.
func redisTestURL(t *testing.T) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "{idemcli-" + hex.EncodeToString(b[:]) + "}:"
	c := redis.NewClient(&redis.Options{Addr: testRedisAddr()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		t.Fatalf("redis at %s is unreachable (.ci/run starts one): %v", testRedisAddr(), err)
	}
	t.Cleanup(func() {
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		keys, err := c.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Errorf("redis keys: %v", err)
			return
		}
		if len(keys) > 0 {
			_ = c.Del(ctx, keys...).Err()
		}
	})
	return "redis://" + testRedisAddr() + "/0?prefix=" + prefix
}

// Two simulators sharing one Redis store: a key charged by the first is
// replayed by the second, which charges nothing. With memory stores (the
// default) the second would charge again: the store is what they share.
func TestPaysimSharesARedisStore(t *testing.T) {
	t.Parallel()
	a := sharedStore(t, redisTestURL(t))
	// The shared server runs without persistence: the check at start says
	// so on stderr.
	if !strings.Contains(a.stderrText(), "appendonly") {
		t.Errorf("no warning about the server's settings on stderr: %q", a.stderrText())
	}
}

// The same with a PostgreSQL store (a schema of the test's own, migrated
// up by paysim).
func TestPaysimSharesAPostgresStore(t *testing.T) {
	t.Parallel()
	sharedStore(t, testdb.New(t, testdb.Empty()).URL)
}

// sharedStore runs two simulators on the store at url and returns the
// first, stopped.
func sharedStore(t *testing.T, url string) *paysimProc {
	t.Helper()
	a := startPaysim(t, nil, "--store", url)
	b := startPaysim(t, []string{"PAYSIM_STORE=" + url})
	cmd := paysim.ChargeCommand{IdempotencyKey: "shared-key-1", OrderID: "o-1", CustomerID: "c-1", AmountKopecks: 1000}
	first, err := paysimClient(t, a.url).Charge(t.Context(), cmd)
	if err != nil || first.Replayed {
		t.Fatalf("first charge %+v, %v", first, err)
	}
	cb := paysimClient(t, b.url)
	again, err := cb.Charge(t.Context(), cmd)
	if err != nil || !again.Replayed || again.ChargeID != first.ChargeID {
		t.Fatalf("charge on the second simulator %+v, %v; want the replay of %s", again, err, first.ChargeID)
	}
	if rows, err := cb.Ledger(t.Context()); err != nil || len(rows) != 0 {
		t.Errorf("the second simulator's ledger %+v, %v; want empty (it charged nothing)", rows, err)
	}
	for _, p := range []*paysimProc{a, b} {
		if _, err := p.stop(t); err != nil {
			t.Errorf("exit: %v (stderr %q)", err, p.stderrText())
		}
	}
	return a
}

func TestPaysimStoreBadInput(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name     string
		env      []string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"unknown store", nil, []string{"paysim", "--store", "mongodb://h/db"}, 2, "--store"},
		{"unknown store word", []string{"PAYSIM_STORE=disk"}, []string{"paysim"}, 2, "want memory, postgres"},
		{"bad redis database", nil, []string{"paysim", "--store", "redis://127.0.0.1:6379/zero"}, 2, "invalid Redis URL"},
		{"bad redis option", nil, []string{"paysim", "--store", "redis://:hunter2pass@127.0.0.1:6379/0?dial_timeout=hunter2pass"}, 2, "invalid Redis URL"},
		{"unreachable redis", nil, []string{"paysim", "--store", "redis://127.0.0.1:1/0?dial_timeout=1s"}, 1, "unreachable"},
		{"redis takes REDIS_URL", []string{"REDIS_URL=redis://127.0.0.1:1/0?dial_timeout=1s"}, []string{"paysim", "--store", "redis"}, 1, "127.0.0.1:1"},
		{"malformed postgres", nil, []string{"paysim", "--store", "postgres://::x"}, 2, "malformed"},
		{"unreachable postgres", nil, []string{"paysim", "--store", "postgres://postgres@127.0.0.1:1/x?connect_timeout=2"}, 1, "unreachable"},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, stderr, code := runIdem(t, tt.env, append(tt.args, "--addr", "127.0.0.1:0")...)
			if code != tt.wantCode || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want %d and one line containing %q", code, stderr, tt.wantCode, tt.wantErr)
			}
			if strings.Contains(stderr, "hunter2pass") {
				t.Errorf("stderr quotes the password: %q", stderr)
			}
		})
	}
}
