package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

// The WAL outbox's benchmarks (issue 19). Its results belong to two
// scenarios: wal-1 and wal-10 to `idem bench enqueue` (bench_enqueue.go),
// wal-floor, wal and wal-latency to `idem bench relay` (benchWALRelay,
// called by runBenchRelay). `idem bench wal` is an alias that runs both
// WAL parts with the baselines they are compared to: the enqueue scenario
// with its WAL variants, then the table relay's at-least-once and the WAL
// relay's variants on one backlog size.
func init() {
	registerBench(&benchScenario{
		Name: "wal",
		Summary: "The WAL outbox's results of `idem bench enqueue` and `idem bench relay`, in one\n" +
			"run (an alias of both WAL parts). Enqueue cost: plain, enqueue-1, enqueue-10,\n" +
			"wal-1, wal-10 (as `bench enqueue`: --clients clients, --seconds per variant in\n" +
			"--rounds interleaved rounds). Relay: --events events drained, in 2 interleaved\n" +
			"rounds, by wal-floor (the slot's raw logical-decoding rate: pgoutput with the\n" +
			"relay's options, read and acknowledged, no decoding of idem's encoding, no\n" +
			"publisher) and wal (to Kafka, acked), then the table relay's at-least-once;\n" +
			"then wal-latency: commit → Kafka ack at --rate events/s. Fails (exit 1, a line\n" +
			"FLOOR BEATEN) if wal beats wal-floor by more than the rounds' spread. Needs\n" +
			"wal_level=logical. In-process kfake broker; scratch schemas, slots and\n" +
			"publications are dropped after.",
		Flags: func(fs *benchFlags) {
			fs.Int("seconds", 6, "measured seconds per enqueue variant, split over the rounds")
			fs.Int("rounds", 3, "interleaved rounds of the enqueue variants")
			fs.Int("clients", 16, "concurrent clients of the enqueue variants")
			fs.Int("events", 200_000, "events drained by each relay variant")
			fs.Int("batch-size", 1000, "relay batch size")
			fs.Int("latency-events", 5000, "events of the wal-latency run")
			fs.Int("rate", 1000, "events per second in the wal-latency run")
		},
		Run: runBenchWAL,
	})
}

// benchWALLevel fails, in one line naming wal_level, when the server
// behind pool does not decode logical WAL; what names the results that
// need it.
func benchWALLevel(ctx context.Context, pool *pgxpool.Pool, what string) error {
	var level string
	if err := pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return err
	}
	if level != "logical" {
		return fmt.Errorf("%s need wal_level=logical, the server has wal_level=%s: set it (and restart the server), or pass --wal=false to leave the WAL results out: %w",
			what, level, wal.ErrNotLogical)
	}
	return nil
}

// benchWALWanted tells whether a scenario with table and WAL results runs
// its WAL ones, which --wal (true by default) asks for. On a server
// without wal_level=logical (a stock install has replica) the default
// leaves them out, with one line on the log saying so and why, and the table
// results still run; an explicit --wal (or --wal=true) fails as
// benchWALLevel does, since the caller asked for those results.
func benchWALWanted(ctx context.Context, env *benchEnv, pool *pgxpool.Pool, what string) (bool, error) {
	err := benchWALLevel(ctx, pool, what)
	if err == nil || !errors.Is(err, wal.ErrNotLogical) || env.Set["wal"] {
		return err == nil, err
	}
	var level string
	_ = pool.QueryRow(ctx, "SHOW wal_level").Scan(&level)
	fmt.Fprintf(env.Log, "%s skipped: they need wal_level=logical and the server has wal_level=%s (set it and restart the server to run them; --wal=false leaves them out without this line)\n", what, level)
	return false, nil
}

// benchWALFlags checks the flags benchWALRelay reads.
func benchWALFlags(env *benchEnv) error {
	for _, name := range []string{"events", "batch-size", "latency-events", "rate"} {
		if *env.Ints[name] < 1 {
			return cli.Usagef("--%s must be at least 1", name)
		}
	}
	if *env.Ints["batch-size"] > wal.BatchSizeMax {
		return cli.Usagef("--batch-size must be at most %d", wal.BatchSizeMax)
	}
	return nil
}

func runBenchWAL(ctx context.Context, env *benchEnv) ([]benchResult, error) {
	if err := benchWALFlags(env); err != nil {
		return nil, err
	}
	for _, name := range []string{"seconds", "clients", "rounds"} {
		if *env.Ints[name] < 1 {
			return nil, cli.Usagef("--%s must be at least 1", name)
		}
	}
	urls, drop, err := scratchSchemas(ctx, env.DatabaseURL, "bench_wal", 1, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	pu, _ := url.Parse(urls[0])
	q := pu.Query()
	q.Set("pool_max_conns", "20")
	pu.RawQuery = q.Encode()
	pool, err := cli.Connect(ctx, pu.String())
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := benchWALLevel(ctx, pool, "bench wal: the WAL outbox's results"); err != nil {
		return nil, err
	}
	if _, err := migrate.Up(ctx, pool); err != nil {
		return nil, fmt.Errorf("migrate scratch schema: %w", err)
	}
	res, err := benchEnqueue(ctx, env, true)
	if err != nil {
		return nil, err
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ProducerBatchCompression(kgo.NoCompression()))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	for _, topic := range []string{"bench.relay", "bench.latency"} {
		resp, err := kadm.NewClient(cl).CreateTopic(ctx, 8, 1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			return nil, fmt.Errorf("create topic: %w", err)
		}
	}
	pub, err := kafka.NewPublisher(cl, nil)
	if err != nil {
		return nil, err
	}
	rel, err := benchWALRelay(ctx, env, urls[0], pool, pub)
	if err != nil {
		return nil, err
	}

	// The table relay, same broker, same count: its at-least-once mode.
	events, batchSize := *env.Ints["events"], *env.Ints["batch-size"]
	fmt.Fprintf(env.Log, "wal: at-least-once: seeding and draining %d events...\n", events)
	if err := benchRelaySeed(ctx, pool, "agg-", events, 1000, 0); err != nil {
		return nil, err
	}
	tr, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{BatchSize: batchSize, DisableNotify: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	total := 0
	for {
		n, err := tr.RunBatch(ctx)
		if err != nil {
			return nil, fmt.Errorf("at-least-once: %w", err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	if total != events {
		return nil, fmt.Errorf("at-least-once: published %d of %d events", total, events)
	}
	alo := latencyResult("at-least-once", nil, events, time.Since(t0))
	// wal-floor, wal, at-least-once, wal-latency: the order of before the fold.
	out := append(res, rel[0], rel[1], alo, rel[2])
	benchWALRatios(env.Log, out)
	return out, nil
}

// benchWALRatios sets wal's ratio to wal-floor, same run, and prints the
// issue's targets for the WAL relay on the log: wal ≥ 0.5 × wal-floor,
// wal ≥ 3 × the table relay's at-least-once, wal-latency p50 ≤ 5 ms and
// p99 ≤ 50 ms.
func benchWALRatios(log io.Writer, results []benchResult) {
	ops := map[string]float64{}
	var lat *benchResult
	for i, r := range results {
		ops[r.Name] = r.OpsPerSec
		if r.Name == "wal-latency" {
			lat = &results[i]
		}
	}
	if ops["wal-floor"] > 0 {
		for i := range results {
			if results[i].Name == "wal" {
				results[i].Ratio = results[i].OpsPerSec / ops["wal-floor"]
			}
		}
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	for _, t := range []struct {
		base string
		min  float64
	}{{"wal-floor", 0.5}, {"at-least-once", 3}} {
		if ops["wal"] == 0 || ops[t.base] == 0 {
			continue
		}
		got := ops["wal"] / ops[t.base]
		fmt.Fprintf(log, "wal: wal / %s = %.2f (target ≥ %.2f: %s)\n", t.base, got, t.min, verdict(got >= t.min))
	}
	if lat != nil {
		fmt.Fprintf(log, "wal: wal-latency p50 %.2f ms, p99 %.2f ms (target ≤ 5 / ≤ 50: %s)\n", lat.P50Ms, lat.P99Ms,
			verdict(lat.P50Ms <= 5 && lat.P99Ms <= 50))
	}
}

// benchCounter is a publisher that counts and acknowledges; with next, it
// counts what next acknowledged.
type benchCounter struct {
	next outbox.Publisher
	n    atomic.Int64
	done chan struct{}
	want int64
	once sync.Once
}

func (c *benchCounter) Publish(ctx context.Context, events []outbox.Event) error {
	if c.next != nil {
		if err := c.next.Publish(ctx, events); err != nil {
			var be *outbox.BatchError
			if errors.As(err, &be) {
				for _, e := range be.Errs {
					if e == nil {
						c.add(1)
					}
				}
			}
			return err
		}
	}
	c.add(int64(len(events)))
	return nil
}

func (c *benchCounter) add(n int64) {
	if c.n.Add(n) >= c.want {
		c.once.Do(func() { close(c.done) })
	}
}

// benchWALRelay drains --events events through wal-floor (benchWALRaw: the
// slot read raw and acknowledged) and wal (the relay, through pub, to
// Kafka, acknowledged), in benchFloorRounds interleaved rounds of a fresh
// backlog each, fails if wal beats wal-floor by more than the rounds'
// noise (benchFloorCheck), then measures wal-latency. dbURL and pool
// name a scratch schema on a server with wal_level=logical; pub publishes
// to a broker with the topics bench.relay and bench.latency.
func benchWALRelay(ctx context.Context, env *benchEnv, dbURL string, pool *pgxpool.Pool, pub outbox.Publisher) ([]benchResult, error) {
	events, batchSize := *env.Ints["events"], *env.Ints["batch-size"]
	quiet := slog.New(slog.DiscardHandler)
	var b [6]byte
	_, _ = rand.Read(b[:])
	run := "bench_wal_" + hex.EncodeToString(b[:])
	fmt.Fprintf(env.Log, "wal: slots and publications %s_…\n", run)
	var slots []string
	defer func() {
		dctx := context.WithoutCancel(ctx)
		for _, s := range slots {
			for range 100 { // a slot stays active for a moment after its reader left
				if _, err := pool.Exec(dctx, "SELECT pg_drop_replication_slot($1)", s); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			_, _ = pool.Exec(dctx, "DROP PUBLICATION IF EXISTS "+s)
		}
	}()
	// newRelay creates the variant's slot (by a first Start) and returns
	// a relay on it, stopped.
	newRelay := func(name string, p outbox.Publisher) (*wal.Relay, string, error) {
		slot := run + "_" + strings.ReplaceAll(name, "-", "_")
		slots = append(slots, slot)
		prefix := "idem.bench." + slot
		r, err := wal.NewRelay(dbURL, p, &wal.Config{Slot: slot, Publication: slot, Prefix: prefix, BatchSize: batchSize,
			LagInterval: -1, Logger: quiet})
		if err != nil {
			return nil, "", err
		}
		if err := r.Start(ctx); err != nil {
			return nil, "", err
		}
		return r, prefix, r.Stop(ctx)
	}
	backlog := func(prefix, topic string, n int) error {
		enq := wal.Enqueuer{Prefix: prefix}
		for i := 0; i < n; i += 1000 {
			var msgs []outbox.Message
			for j := i; j < min(i+1000, n); j++ {
				msgs = append(msgs, outbox.Message{Topic: topic, AggregateType: "order", AggregateID: "agg-" + strconv.Itoa(j%1000),
					EventID: "ev-" + strconv.Itoa(j), EventType: "BenchEvent", Payload: make([]byte, 100)})
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := enq.EnqueueTx(ctx, tx, msgs...); return err }); err != nil {
				return err
			}
		}
		return nil
	}
	drain := func(name string, r *wal.Relay, c *benchCounter) (benchResult, error) {
		fmt.Fprintf(env.Log, "wal: %s: draining %d events...\n", name, c.want)
		t0 := time.Now()
		if err := r.Start(ctx); err != nil {
			return benchResult{}, err
		}
		defer func() { _ = r.Stop(context.WithoutCancel(ctx)) }()
		select {
		case <-c.done:
		case <-time.After(10 * time.Minute):
			return benchResult{}, fmt.Errorf("%s: %d of %d events published in 10 minutes", name, c.n.Load(), events)
		case <-ctx.Done():
			return benchResult{}, ctx.Err()
		}
		return latencyResult(name, nil, int(c.want), time.Since(t0)), nil
	}

	// wal-floor and wal take turns, benchFloorRounds rounds of a fresh
	// backlog each (the order alternating), so that a drift of the shared
	// machine falls on both and the run measures its own noise.
	per := (events + benchFloorRounds - 1) / benchFloorRounds
	floorSlot := run + "_wal_floor"
	slots = append(slots, floorSlot)
	if _, err := pool.Exec(ctx, "CREATE PUBLICATION "+floorSlot); err != nil {
		return nil, fmt.Errorf("wal-floor: publication: %w", err)
	}
	if _, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", floorSlot); err != nil {
		return nil, fmt.Errorf("wal-floor: slot: %w", err)
	}
	c := &benchCounter{}
	r, prefix, err := newRelay("wal", c)
	if err != nil {
		return nil, err
	}
	walSlot := slots[len(slots)-1]
	rounds := map[string][]float64{}
	elapsed := map[string]time.Duration{}
	for round := range benchFloorRounds {
		order := []string{"wal-floor", "wal"}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			// Each variant's slot skips what was written since it last
			// read (the other's backlog), untimed: both decode the same
			// WAL, their own backlog only.
			slot := floorSlot
			if name == "wal" {
				slot = walSlot
			}
			if err := benchSlotAdvance(ctx, pool, slot); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			fmt.Fprintf(env.Log, "wal: round %d: %s: writing a backlog of %d events...\n", round+1, name, per)
			var d time.Duration
			if name == "wal-floor" {
				fprefix := "idem.bench." + floorSlot + ".r" + strconv.Itoa(round)
				if err := backlog(fprefix, "bench.relay", per); err != nil {
					return nil, err
				}
				fmt.Fprintf(env.Log, "wal: round %d: wal-floor: reading %d events raw from the slot...\n", round+1, per)
				if d, err = benchWALRaw(ctx, dbURL, floorSlot, floorSlot, fprefix, per); err != nil {
					return nil, err
				}
			} else {
				if err := backlog(prefix, "bench.relay", per); err != nil {
					return nil, err
				}
				// The relay is stopped between rounds: nothing publishes.
				c.n.Store(0)
				c.done, c.want, c.once = make(chan struct{}), int64(per), sync.Once{}
				c.next = pub
				res, err := drain(name, r, c)
				if err != nil {
					return nil, err
				}
				d = time.Duration(float64(time.Second) * float64(per) / res.OpsPerSec)
			}
			elapsed[name] += d
			rounds[name] = append(rounds[name], float64(per)/d.Seconds())
		}
	}
	for _, name := range []string{"wal-floor", "wal"} {
		fmt.Fprintf(env.Log, "wal: %s: rounds %s events/s\n", name, benchRates(rounds[name]))
	}
	if err := benchFloorCheck(env.Log, "wal-floor", rounds, []string{"wal"}); err != nil {
		return nil, err
	}
	out := []benchResult{
		latencyResult("wal-floor", nil, per*benchFloorRounds, elapsed["wal-floor"]),
		latencyResult("wal", nil, per*benchFloorRounds, elapsed["wal"]),
	}

	lat, err := benchWALLatency(ctx, env, pool, pub, newRelay)
	if err != nil {
		return nil, fmt.Errorf("wal-latency: %w", err)
	}
	return append(out, lat), nil
}

// benchSlotAdvance moves slot's confirmed position to the server's
// current WAL position, retrying while the slot's last reader is still
// leaving it.
func benchSlotAdvance(ctx context.Context, pool *pgxpool.Pool, slot string) error {
	var err error
	for range 100 {
		if _, err = pool.Exec(ctx, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", slot); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond) // the slot stays active for a moment after its reader left
	}
	return fmt.Errorf("advance slot %s: %w", slot, err)
}

// benchWALLatency: one event per transaction at --rate, commit → Kafka
// acknowledgement (the publisher's return), p50 and p99.
func benchWALLatency(ctx context.Context, env *benchEnv, pool *pgxpool.Pool, pub outbox.Publisher,
	newRelay func(string, outbox.Publisher) (*wal.Relay, string, error)) (benchResult, error) {
	n, rate := *env.Ints["latency-events"], *env.Ints["rate"]
	committed := make([]atomic.Int64, n)
	acked := make([]atomic.Int64, n)
	var got atomic.Int64
	all := make(chan struct{})
	lp := &benchLatencyPublisher{next: pub, ack: func(id string, at time.Time) {
		i, err := strconv.Atoi(id)
		if err != nil || i < 0 || i >= n || !acked[i].CompareAndSwap(0, at.UnixNano()) {
			return
		}
		if got.Add(1) == int64(n) {
			close(all)
		}
	}}
	r, prefix, err := newRelay("latency", lp)
	if err != nil {
		return benchResult{}, err
	}
	if err := r.Start(ctx); err != nil {
		return benchResult{}, err
	}
	defer func() { _ = r.Stop(context.WithoutCancel(ctx)) }()
	enq := wal.Enqueuer{Prefix: prefix}
	fmt.Fprintf(env.Log, "wal: wal-latency: %d events at %d/s...\n", n, rate)
	const nWriters = 16
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, nWriters)
	for w := range nWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += nWriters {
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d) // pacing the load, not waiting for a result
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := enq.EnqueueTx(ctx, tx, outbox.Message{Topic: "bench.latency", AggregateType: "order",
						AggregateID: strconv.Itoa(i % 1000), EventID: strconv.Itoa(i), EventType: "BenchEvent", Payload: []byte("x")})
					return err
				})
				if err != nil {
					errs <- err
					return
				}
				// The commit returned: the latency runs from here (an ack
				// that came first counts as 0).
				committed[i].Store(time.Now().UnixNano())
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return benchResult{}, err
	}
	elapsed := time.Since(start)
	select {
	case <-all:
	case <-time.After(2 * time.Minute):
		return benchResult{}, fmt.Errorf("%d of %d events acknowledged", got.Load(), n)
	}
	lat := make([]float64, n)
	for i := range lat {
		lat[i] = max(float64(acked[i].Load()-committed[i].Load())/1e6, 0)
	}
	return latencyResult("wal-latency", lat, n, elapsed), nil
}

// benchLatencyPublisher stamps each event when next acknowledged it.
type benchLatencyPublisher struct {
	next outbox.Publisher
	ack  func(id string, at time.Time)
}

func (p *benchLatencyPublisher) Publish(ctx context.Context, events []outbox.Event) error {
	err := p.next.Publish(ctx, events)
	now := time.Now()
	var be *outbox.BatchError
	for i, e := range events {
		if err == nil || (errors.As(err, &be) && be.Errs[i] == nil) {
			p.ack(e.EventID, now)
		}
	}
	return err
}
