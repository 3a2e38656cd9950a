package testdb

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgtemp"
)

// LogicalSettings are the server settings that logical decoding tests need
// (the WAL outbox, package outbox/wal): .ci/run sets the same on the local
// server.
var LogicalSettings = []string{"wal_level=logical", "max_replication_slots=64", "max_wal_senders=64"}

// LogicalMain is for the TestMain of a package whose tests decode the WAL.
// When the server at URL() runs with wal_level=logical (CI sets it), it
// does nothing. Otherwise it starts a throwaway cluster (package pgtemp)
// with LogicalSettings and points TEST_DATABASE_URL at it, so that every
// test of the package, and every child process it starts, uses that one:
// the tests run either way and are never skipped. The returned func stops
// the cluster; call it after m.Run.
func LogicalMain() (stop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if level, err := walLevel(ctx, URL()); err == nil && level == "logical" {
		return func() {}, nil
	}
	cl, err := pgtemp.Start(ctx, &pgtemp.Config{Settings: LogicalSettings})
	if err != nil {
		return nil, fmt.Errorf("testdb: wal_level is not logical on %s and no throwaway cluster could start: %w", redact(URL()), err)
	}
	prev, had := os.LookupEnv("TEST_DATABASE_URL")
	if err := os.Setenv("TEST_DATABASE_URL", cl.URL); err != nil {
		_ = cl.Close()
		return nil, err
	}
	return func() {
		if had {
			_ = os.Setenv("TEST_DATABASE_URL", prev)
		} else {
			_ = os.Unsetenv("TEST_DATABASE_URL")
		}
		_ = cl.Close()
	}, nil
}

func walLevel(ctx context.Context, url string) (string, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer c.Close(context.Background())
	var level string
	err = c.QueryRow(ctx, "SHOW wal_level").Scan(&level)
	return level, err
}
