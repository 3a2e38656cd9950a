package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/redisstore"
)

// billingRedisPrefix is the key prefix of billing's records in Redis,
// unless IDEMPOTENCY_STORE's URL has ?prefix=.
const billingRedisPrefix = "{billing}:"

// redisURLDefault is IDEMPOTENCY_STORE=redis without REDIS_URL.
const redisURLDefault = "redis://127.0.0.1:6379/0"

// idempotencyStore reads IDEMPOTENCY_STORE: unset, empty or "postgres"
// is nil (the records in DATABASE_URL, transactional mode); a redis://,
// rediss:// or unix:// URL, or "redis" (REDIS_URL, else the local
// server's database 0), is a Redis store (two-step mode), checked at
// once: unreachable is an error, settings that void its guarantee are
// logged as warnings. Anything else, or a URL that does not parse, is a
// usage error (exit 2). The returned func closes the store.
func idempotencyStore(ctx context.Context, log *slog.Logger) (idempotency.Store, func(), error) {
	spec := os.Getenv("IDEMPOTENCY_STORE")
	if spec == "" || spec == "postgres" {
		return nil, func() {}, nil
	}
	if spec == "redis" {
		spec = cli.Env("REDIS_URL", redisURLDefault)
	}
	if !redisstore.IsURL(spec) {
		return nil, nil, cli.Usagef("IDEMPOTENCY_STORE %s: want postgres, redis (REDIS_URL) or a redis:// URL", cli.Redact(spec))
	}
	cli.HideURL(spec)
	// go-redis logs each failed dial itself; the error below says it once.
	redis.SetLogger(discardRedisLog{})
	s, err := redisstore.Open(spec, &redisstore.Config{Prefix: billingRedisPrefix, Logger: log})
	if err != nil {
		if errors.Is(err, redisstore.ErrInvalidURL) || errors.Is(err, redisstore.ErrInvalidConfig) {
			return nil, nil, cli.Usagef("IDEMPOTENCY_STORE: %v", err)
		}
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.CheckServer(cctx); err != nil {
		_ = s.Close()
		return nil, nil, fmt.Errorf("IDEMPOTENCY_STORE %s is unreachable: %v", cli.Redact(spec), err)
	}
	log.Info("billing: idempotency records in Redis, two-step mode (see the redisstore package doc for what Redis must keep)", "store", cli.Redact(spec))
	return s, func() { _ = s.Close() }, nil
}

type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}
