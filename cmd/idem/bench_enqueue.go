package main

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

func init() {
	registerBench(&benchScenario{
		Name: "enqueue",
		Summary: "What the outbox costs a business transaction, --clients concurrent clients:\n" +
			"plain (BEGIN, one INSERT of a business row, COMMIT: the baseline), enqueue-1\n" +
			"(the same plus outbox.EnqueueTx of one event) and enqueue-10 (of ten events),\n" +
			"each event of an aggregate of its own transaction; wal-1 and wal-10: the same\n" +
			"events written to the WAL by the WAL outbox (package outbox/wal), no table row;\n" +
			"sql-enqueue-1: enqueue-1 through database/sql (lib/pq) and outbox.EnqueueSQLTx.\n" +
			"Ratios are to plain. Variants run interleaved in rounds. Scratch schema\n" +
			"(dropped after). The wal-* variants need wal_level=logical on the server:\n" +
			"without it they are skipped with one line and the rest runs (an explicit\n" +
			"--wal makes it an error; --wal=false leaves them out).",
		Flags: func(fs *benchFlags) {
			fs.Int("seconds", 6, "measured seconds per variant, split over the rounds")
			fs.Int("rounds", 3, "interleaved rounds: every round runs every variant once")
			fs.Int("clients", 16, "concurrent clients")
			fs.Bool("wal", true, "run the WAL outbox's variants wal-1 and wal-10 (need wal_level=logical); false leaves them out")
		},
		Run: runBenchEnqueue,
	})
}

func runBenchEnqueue(ctx context.Context, env *benchEnv) ([]benchResult, error) {
	return benchEnqueue(ctx, env, *env.Bools["wal"])
}

// benchEnqueue runs plain, enqueue-1 and enqueue-10, and with withWAL
// wal-1 and wal-10 too, interleaved in the same rounds.
func benchEnqueue(ctx context.Context, env *benchEnv, withWAL bool) ([]benchResult, error) {
	seconds, clients, rounds := *env.Ints["seconds"], *env.Ints["clients"], *env.Ints["rounds"]
	for name, v := range map[string]int{"seconds": seconds, "clients": clients, "rounds": rounds} {
		if v < 1 {
			return nil, cli.Usagef("--%s must be at least 1", name)
		}
	}
	urls, drop, err := scratchSchemas(ctx, env.DatabaseURL, "bench_enqueue", 1, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	u, _ := url.Parse(urls[0])
	q := u.Query()
	fmt.Fprintf(env.Log, "enqueue: scratch schema %s\n", q.Get("search_path"))
	q.Set("pool_max_conns", strconv.Itoa(clients))
	u.RawQuery = q.Encode()
	pool, err := cli.Connect(ctx, u.String())
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if withWAL {
		if withWAL, err = benchWALWanted(ctx, env, pool, "bench enqueue: wal-1 and wal-10"); err != nil {
			return nil, err
		}
	}
	if _, err := migrate.Up(ctx, pool); err != nil {
		return nil, fmt.Errorf("migrate scratch schema: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_enqueue_order (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		customer_id text NOT NULL, total_kopecks bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	run := uniqueRun()
	var seq atomic.Int64
	// op is one business transaction: the order row, then n events about
	// it (its own aggregate, as a real order's events are), one commit.
	// The WAL variants write with a prefix no relay reads.
	walEnq := wal.Enqueuer{Prefix: "idem.bench.unread"}
	op := func(n int, inWAL bool) func(context.Context) error {
		return func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var id int64
				if err := tx.QueryRow(ctx, `INSERT INTO bench_enqueue_order (customer_id, total_kopecks) VALUES ($1, $2) RETURNING id`,
					"c1", 1000).Scan(&id); err != nil {
					return err
				}
				if n == 0 {
					return nil
				}
				agg := run + "-" + strconv.FormatInt(seq.Add(1), 10)
				msgs := make([]outbox.Message, n)
				for i := range msgs {
					msgs[i] = outbox.Message{Topic: "orders.events", AggregateType: "order", AggregateID: agg,
						EventType: "OrderCreated", Payload: []byte(`{"customer_id":"c1","total_kopecks":1000}`)}
				}
				if inWAL {
					_, err := walEnq.EnqueueTx(ctx, tx, msgs...)
					return err
				}
				_, err := outbox.EnqueueTx(ctx, tx, msgs...)
				return err
			})
		}
	}
	variants := []struct {
		name string
		op   func(context.Context) error
	}{{"plain", op(0, false)}, {"enqueue-1", op(1, false)}, {"enqueue-10", op(10, false)}}
	if withWAL {
		variants = append(variants, []struct {
			name string
			op   func(context.Context) error
		}{{"wal-1", op(1, true)}, {"wal-10", op(10, true)}}...)
	}
	// sql-enqueue-1 last: the ratios above index the variants before it.
	sqlURL := u.Query()
	sqlURL.Del("pool_max_conns")
	su := *u
	su.RawQuery = sqlURL.Encode()
	sqlOp, closeSQL, err := sqlEnqueueVariant(su.String(), clients, run, &seq)
	if err != nil {
		return nil, err
	}
	defer closeSQL()
	variants = append(variants, struct {
		name string
		op   func(context.Context) error
	}{"sql-enqueue-1", sqlOp})
	// Interleaved rounds, as in bench http: a drift of the shared machine
	// falls on every variant alike.
	dur := time.Duration(seconds) * time.Second
	slice := dur / time.Duration(rounds)
	samples := make([]benchSamples, len(variants))
	for round := range rounds {
		for i, v := range variants {
			warm := 200 * time.Millisecond
			if round == 0 {
				warm = time.Second
			}
			if err := benchLoad(ctx, clients, warm, slice, v.op, &samples[i]); err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
		}
	}
	var results []benchResult
	for i, v := range variants {
		r := samples[i].result(v.name)
		results = append(results, r)
	}
	for i := range results {
		results[i].Ratio = results[i].OpsPerSec / results[0].OpsPerSec
		fmt.Fprintf(env.Log, "enqueue: %s: %.0f tx/s, %.2f × plain\n", results[i].Name, results[i].OpsPerSec, results[i].Ratio)
	}
	if len(results) > 1 {
		verdict := "met"
		if results[1].Ratio < 0.75 {
			verdict = "MISSED"
		}
		fmt.Fprintf(env.Log, "enqueue: enqueue-1 / plain = %.2f (target ≥ 0.75: %s)\n", results[1].Ratio, verdict)
	}
	if withWAL {
		r := results[3].Ratio
		verdict := "met"
		if r < 0.75 {
			verdict = "MISSED"
		}
		fmt.Fprintf(env.Log, "enqueue: wal-1 / plain = %.2f (target ≥ 0.75: %s)\n", r, verdict)
	}
	sr := results[len(results)-1].OpsPerSec / results[1].OpsPerSec
	verdict := "met"
	if sr < 0.8 {
		verdict = "MISSED"
	}
	fmt.Fprintf(env.Log, "enqueue: sql-enqueue-1 / enqueue-1 = %.2f (target ≥ 0.8: %s)\n", sr, verdict)
	return results, nil
}
