package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/redisstore"
)

// redisURLDefault is what "redis" alone means to --store without
// REDIS_URL: the local server, database 0.
const redisURLDefault = "redis://127.0.0.1:6379/0"

// openedStore is an idempotency store named on a command line, and how to
// let it go.
type openedStore struct {
	store idempotency.Store
	kind  string // "memory", "postgres", "redis"
	close func()
}

// openStore opens the store that spec names: "memory", "postgres" (the
// database at dbURL) or a postgres:// URL (its idem tables migrated up),
// "redis" (REDIS_URL, else redisURLDefault) or a redis://, rediss:// or
// unix:// URL,
// checked with CheckServer: a server that cannot be reached is an error, a
// setting that voids the guarantee a warning on stderr. A spec that is
// none of these, or a URL that does not parse, is a usage error (exit 2).
// prefix is the Redis key prefix when the URL names none.
func openStore(ctx context.Context, spec, dbURL, prefix string, log *slog.Logger) (*openedStore, error) {
	switch {
	case spec == "memory":
		return &openedStore{store: idempotency.NewMemoryStore(), kind: "memory", close: func() {}}, nil
	case spec == "postgres" || strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://"):
		if spec != "postgres" {
			dbURL = spec
		}
		pool, err := cli.Connect(ctx, dbURL)
		if err != nil {
			return nil, err
		}
		if _, err := migrate.Up(ctx, pool); err != nil {
			pool.Close()
			return nil, fmt.Errorf("migrate the idempotency store: %w", err)
		}
		return &openedStore{store: idempotency.NewPostgresStore(pool), kind: "postgres", close: pool.Close}, nil
	case spec == "redis" || redisstore.IsURL(spec):
		if spec == "redis" {
			spec = cli.Env("REDIS_URL", redisURLDefault)
		}
		cli.HideURL(spec)
		// go-redis logs every failed dial on its own; the errors it
		// returns say the same, once, where the program reports them.
		redis.SetLogger(discardRedisLog{})
		s, err := redisstore.Open(spec, &redisstore.Config{Prefix: prefix, Logger: log})
		if err != nil {
			if errors.Is(err, redisstore.ErrInvalidURL) || errors.Is(err, redisstore.ErrInvalidConfig) {
				return nil, cli.Usagef("--store: %v", err)
			}
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := s.CheckServer(cctx); err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("redis %s is unreachable: %v", cli.Redact(spec), err)
		}
		return &openedStore{store: s, kind: "redis", close: func() { _ = s.Close() }}, nil
	}
	return nil, cli.Usagef("--store %q: want memory, postgres, a postgres:// URL, redis or a redis:// URL", cli.Redact(spec))
}

type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}
