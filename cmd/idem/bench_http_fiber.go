package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v3"
	fiberidem "github.com/gofiber/fiber/v3/middleware/idempotency"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// benchFiberSummary is bench http's help for --fiber.
const benchFiberSummary = "\nWith --fiber, the http-vs-fiber comparison in the same rounds: plain (net/http,\n" +
	"  no middleware, the same row), fiber-plain (a Fiber handler writing the same\n" +
	"  row, no middleware), fiber-pg (Fiber v3's idempotency middleware over a\n" +
	"  PostgreSQL fiber.Storage issuing the statements of gofiber/storage/postgres),\n" +
	"  fiber-pg-replay (repeats of completed keys through it), fiber-tx-replay\n" +
	"  (idemfiber's replays, the same stack as fiber-pg-replay) and postgres-replay\n" +
	"  (idem's replays with the in-process replay cache off); the log prints\n" +
	"  (transactional/plain)/(fiber-pg/fiber-plain), target 1.5, and\n" +
	"  (replay/plain)/(fiber-pg-replay/fiber-plain), target 2.5."

// fiberPGTable is the table of benchFiberStorage, the official storage's
// default name.
const fiberPGTable = "fiber_storage"

// benchFiberStorage is a fiber.Storage over PostgreSQL for the bench: the
// table and statements of Fiber's official storage
// (github.com/gofiber/storage/postgres/v3, not a dependency of this
// module), over the bench's pool. Its table: k text primary key, v bytea,
// e bigint (expiry, Unix seconds, 0 for none), an index on e. Get is one
// SELECT of v and e by k, answering nil for a row past its expiry; Set one
// INSERT … ON CONFLICT (k) DO UPDATE of v and e, the expiry rounded up to
// the second; Delete one DELETE by k; Reset a TRUNCATE. Each statement
// runs on its own (autocommit), as there. No expired-row GC: a bench run
// is shorter than the middleware's lifetime.
type benchFiberStorage struct {
	db *pgxpool.Pool
}

var _ fiber.Storage = (*benchFiberStorage)(nil)

// newBenchFiberStorage creates the storage's table (if missing) in the
// pool's schema.
func newBenchFiberStorage(ctx context.Context, db *pgxpool.Pool) (*benchFiberStorage, error) {
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+fiberPGTable+` (
		k text PRIMARY KEY NOT NULL DEFAULT '',
		v bytea NOT NULL,
		e bigint NOT NULL DEFAULT 0)`); err != nil {
		return nil, fmt.Errorf("fiber storage: %w", err)
	}
	if _, err := db.Exec(ctx, `CREATE INDEX IF NOT EXISTS `+fiberPGTable+`_e ON `+fiberPGTable+` (e)`); err != nil {
		return nil, fmt.Errorf("fiber storage: %w", err)
	}
	return &benchFiberStorage{db: db}, nil
}

func (s *benchFiberStorage) GetWithContext(ctx context.Context, key string) ([]byte, error) {
	if key == "" {
		return nil, nil
	}
	var (
		v []byte
		e int64
	)
	if err := s.db.QueryRow(ctx, `SELECT v, e FROM `+fiberPGTable+` WHERE k = $1`, key).Scan(&v, &e); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil
		}
		return nil, err
	}
	if e != 0 && e <= time.Now().Unix() {
		return nil, nil
	}
	return v, nil
}

func (s *benchFiberStorage) Get(key string) ([]byte, error) {
	return s.GetWithContext(context.Background(), key)
}

func (s *benchFiberStorage) SetWithContext(ctx context.Context, key string, val []byte, exp time.Duration) error {
	if key == "" || len(val) == 0 {
		return nil
	}
	var e int64
	if exp > 0 {
		deadline := time.Now().Add(exp)
		e = deadline.Unix()
		if deadline.Nanosecond() != 0 {
			e++
		}
	}
	_, err := s.db.Exec(ctx, `INSERT INTO `+fiberPGTable+` (k, v, e) VALUES ($1, $2, $3)
		ON CONFLICT (k) DO UPDATE SET v = $4, e = $5`, key, val, e, val, e)
	return err
}

func (s *benchFiberStorage) Set(key string, val []byte, exp time.Duration) error {
	return s.SetWithContext(context.Background(), key, val, exp)
}

func (s *benchFiberStorage) DeleteWithContext(ctx context.Context, key string) error {
	if key == "" {
		return nil
	}
	_, err := s.db.Exec(ctx, `DELETE FROM `+fiberPGTable+` WHERE k = $1`, key)
	return err
}

func (s *benchFiberStorage) Delete(key string) error {
	return s.DeleteWithContext(context.Background(), key)
}

func (s *benchFiberStorage) ResetWithContext(ctx context.Context) error {
	_, err := s.db.Exec(ctx, `TRUNCATE TABLE `+fiberPGTable)
	return err
}

func (s *benchFiberStorage) Reset() error { return s.ResetWithContext(context.Background()) }

// Close does nothing: the pool is the bench's.
func (s *benchFiberStorage) Close() error { return nil }

// benchFiberRoutes mounts fiber-plain's and fiber-pg's routes on app
// (before it listens): the same handler, writing the row through pool,
// bare and behind Fiber's idempotency middleware over benchFiberStorage
// (its default memory lock and 30-minute lifetime; the key header set to
// Idempotency-Key and its UUID rule off, as for fiber-own).
func benchFiberRoutes(ctx context.Context, app *fiber.App, pool *pgxpool.Pool) error {
	storage, err := newBenchFiberStorage(ctx, pool)
	if err != nil {
		return err
	}
	h := func(c fiber.Ctx) error {
		var id int64
		if err := pool.QueryRow(c.Context(), `INSERT INTO bench_http_row (body) VALUES ($1) RETURNING id`, benchHTTPBody).Scan(&id); err != nil {
			return err
		}
		c.Set("Location", "/rows/"+strconv.FormatInt(id, 10))
		c.Set("Content-Type", "application/json")
		return c.Status(http.StatusCreated).SendString(`{"id":` + strconv.FormatInt(id, 10) + `,"status":"NEW"}`)
	}
	app.Post("/fiber-plain/rows", h)
	app.Post("/fiber-pg/rows", fiberidem.New(fiberidem.Config{
		KeyHeader:         "Idempotency-Key",
		KeyHeaderValidate: func(string) error { return nil },
		Storage:           storage,
	}), h)
	return nil
}

// benchReplayVariant is name: repeats, through path, of 1,000 keys each
// completed once before the rounds.
func benchReplayVariant(name, path string, clients int, newKey func() string, conns *benchConns) benchVariant {
	const replayKeys = 1000
	replay := make([]string, replayKeys)
	var next atomic.Int64
	return benchVariant{name: name, prep: func(ctx context.Context) error {
		var wg sync.WaitGroup
		errs := make([]error, clients)
		for c := range clients {
			wg.Go(func() {
				for i := c; i < replayKeys && errs[c] == nil; i += clients {
					replay[i] = newKey()
					errs[c] = conns.post(ctx, path, replay[i], http.StatusCreated)
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}, op: func(ctx context.Context) error {
		return conns.post(ctx, path, replay[next.Add(1)%replayKeys], http.StatusCreated)
	}}
}

// benchFiberRatios reports the two comparison ratios of --fiber, each
// side's cost measured against its own plain handler, and sets fiber-pg's
// fiber-pg-replay's and fiber-tx-replay's Ratio to fiber-plain.
func benchFiberRatios(log io.Writer, results []benchResult) {
	by := map[string]*benchResult{}
	for i := range results {
		by[results[i].Name] = &results[i]
	}
	ops := func(name string) float64 {
		if r := by[name]; r != nil {
			return r.OpsPerSec
		}
		return 0
	}
	plain, fplain := ops("plain"), ops("fiber-plain")
	if plain <= 0 || fplain <= 0 {
		return
	}
	for _, name := range []string{"fiber-pg", "fiber-pg-replay", "fiber-tx-replay"} {
		if r := by[name]; r != nil {
			r.Ratio = r.OpsPerSec / fplain
		}
	}
	verdict := func(x, target float64) string {
		if x >= target {
			return "met"
		}
		return "NOT met"
	}
	line := func(label, idem, fib string, target float64) {
		if ops(idem) <= 0 || ops(fib) <= 0 {
			return
		}
		x := (ops(idem) / plain) / (ops(fib) / fplain)
		fmt.Fprintf(log, "http: %s vs fiber: (%s/plain) / (%s/fiber-plain) = %.2f (target %.1f: %s)\n",
			label, idem, fib, x, target, verdict(x, target))
	}
	line("fresh", "transactional", "fiber-pg", 1.5)
	line("replay", "replay", "fiber-pg-replay", 2.5)
	// The same HTTP stack (fasthttp) on both sides: idemfiber's fresh
	// requests and replays against Fiber's middleware. Reported, no target.
	if ops("fiber-tx") > 0 && ops("fiber-pg") > 0 && ops("fiber-tx-replay") > 0 && ops("fiber-pg-replay") > 0 {
		fmt.Fprintf(log, "http: on Fiber's stack: fiber-tx/fiber-pg = %.2f, fiber-tx-replay/fiber-pg-replay = %.2f (reported)\n",
			ops("fiber-tx")/ops("fiber-pg"), ops("fiber-tx-replay")/ops("fiber-pg-replay"))
	}
	// The replay cache off: every idem replay reads PostgreSQL, as every
	// Fiber replay does. Reported, no target.
	if ops("postgres-replay") > 0 && ops("fiber-pg-replay") > 0 {
		fmt.Fprintf(log, "http: replay (cache off) vs fiber: (postgres-replay/plain) / (fiber-pg-replay/fiber-plain) = %.2f (reported)\n",
			(ops("postgres-replay")/plain)/(ops("fiber-pg-replay")/fplain))
	}
}
