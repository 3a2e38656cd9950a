package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgtemp"
)

// ErrNoIdem means no idem binary could be found or built.
var ErrNoIdem = errors.New("chaos: no idem binary (set IDEM_BIN, put idem beside billing, or run from the idem module so that it can be built)")

// LocateIdem finds the idem binary: explicit (a flag or IDEM_BIN), else
// "idem" beside the running executable, else a fresh `go build` of
// github.com/idemkit/idem/cmd/idem into dir when the go tool and the
// repository are at hand (the case of `go run ./cmd/billing demo`), else
// idem on PATH.
// logf receives one line about what it does; it may be nil.
func LocateIdem(ctx context.Context, explicit, dir string, logf func(string, ...any)) (string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("chaos: idem binary %s: %w", explicit, err)
		}
		return explicit, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "idem")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	var buildErr error
	if goBin, err := exec.LookPath("go"); err == nil {
		// Inside the repository (its go.work spans every module: the case
		// of `go run ./cmd/billing demo`) the program builds; anywhere
		// else the build fails and idem must come from PATH.
		p := filepath.Join(dir, "idem")
		logf("building idem (go build github.com/idemkit/idem/cmd/idem)")
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", p, "github.com/idemkit/idem/cmd/idem")
		out, err := cmd.CombinedOutput()
		if err == nil {
			return p, nil
		}
		buildErr = fmt.Errorf("go build idem: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if p, err := exec.LookPath("idem"); err == nil {
		return p, nil
	}
	if buildErr != nil {
		return "", fmt.Errorf("%w (%v)", ErrNoIdem, buildErr)
	}
	return "", ErrNoIdem
}

// Reachable reports whether a PostgreSQL server answers at rawURL within
// timeout.
func Reachable(ctx context.Context, rawURL string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return c.Ping(ctx)
}

// FreshSchema creates a new schema on the server at baseURL and returns a
// URL whose search_path selects it (every process given the URL works in
// it), and a function that drops it. A chaos run in its own schema never
// sees another run's orders, keys or ledger.
func FreshSchema(ctx context.Context, baseURL string) (string, func(context.Context) error, error) {
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "chaos_" + hex.EncodeToString(b[:])
	exec := func(ctx context.Context, sql string) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, baseURL)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, fmt.Errorf("chaos: create schema: %w", err)
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return "", nil, fmt.Errorf("chaos: database URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	drop := func(ctx context.Context) error { return exec(ctx, "DROP SCHEMA "+schema+" CASCADE") }
	return u.String(), drop, nil
}

// ErrNoDatabase means neither the given URL nor the local server answers,
// and no throwaway cluster was allowed.
var ErrNoDatabase = errors.New("chaos: no PostgreSQL: DATABASE_URL is empty and the local server does not answer")

// ResolveDatabase applies the embedded defaults of docs/contracts.md:
// envURL (DATABASE_URL) when set, which must answer; else localURL (the
// local server) when it answers; else, with allowTemp, a throwaway cluster
// from the local PostgreSQL binaries (package pgtemp). The returned
// function stops what was started; it is never nil.
func ResolveDatabase(ctx context.Context, envURL, localURL string, allowTemp bool, logf func(string, ...any)) (string, func(), error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	nothing := func() {}
	if envURL != "" {
		if err := Reachable(ctx, envURL, 10*time.Second); err != nil {
			return "", nothing, fmt.Errorf("chaos: DATABASE_URL does not answer: %w", err)
		}
		return envURL, nothing, nil
	}
	if Reachable(ctx, localURL, 3*time.Second) == nil {
		return localURL, nothing, nil
	}
	if !allowTemp {
		return "", nothing, ErrNoDatabase
	}
	logf("no DATABASE_URL and no local server: starting a throwaway PostgreSQL cluster from the local binaries")
	pg, err := pgtemp.Start(ctx, nil)
	if err != nil {
		return "", nothing, err
	}
	return pg.URL, func() { _ = pg.Close() }, nil
}
