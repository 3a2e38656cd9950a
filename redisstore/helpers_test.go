package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/redisstore"
)

// redisAddr is the shared server the tests use: TEST_REDIS_ADDR, else the
// local one (.ci/run starts it, with persistence off).
func redisAddr() string {
	if a := os.Getenv("TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// newClient connects to addr and closes the client when the test ends. An
// unreachable server fails the test: it is never skipped.
func newClient(t testing.TB, addr string, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: addr, PoolSize: 64}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at %s is unreachable (is redis-server running? .ci/run starts one): %v", addr, err)
	}
	return c
}

// testPrefix is a prefix of the test's own, with a hash tag as the
// default has: its keys are deleted when the test ends.
func testPrefix(t testing.TB, c *redis.Client) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	p := "{idemtest-" + hex.EncodeToString(b[:]) + "}:"
	t.Cleanup(func() { deleteKeys(t, c, p) })
	return p
}

func deleteKeys(t testing.TB, c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Errorf("scan %s*: %v", prefix, err)
		return
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		if err := c.Unlink(ctx, keys[:n]...).Err(); err != nil {
			t.Errorf("unlink: %v", err)
			return
		}
		keys = keys[n:]
	}
}

// setup is one test's store on the shared server, under its own prefix.
type setup struct {
	client *redis.Client
	prefix string
	store  *redisstore.Store
}

func newSetup(t testing.TB, cfg *redisstore.Config) *setup {
	t.Helper()
	c := newClient(t, redisAddr())
	p := testPrefix(t, c)
	var cc redisstore.Config
	if cfg != nil {
		cc = *cfg
	}
	cc.Prefix = p
	if cc.Logger == nil {
		cc.Logger = quiet()
	}
	s, err := redisstore.New(c, &cc)
	if err != nil {
		t.Fatal(err)
	}
	return &setup{client: c, prefix: p, store: s}
}
