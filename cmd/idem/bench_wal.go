package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
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

// The WAL outbox's benchmarks (issue 19). Its result names belong to two
// scenarios of the contract: wal-1 and wal-10 to `idem bench enqueue`
// (beside plain, enqueue-1 and enqueue-10), wal-floor, wal and wal-latency
// to `idem bench relay` (beside at-least-once). Until they are folded into
// those, `idem bench wal` runs them all with the baselines they are
// compared to, in the same run: benchWALEnqueue and benchWALRelay are the
// two halves to fold.
func init() {
	registerBench(&benchScenario{
		Name: "wal",
		Summary: "The WAL outbox (package outbox/wal) against its baselines, in one run. Enqueue\n" +
			"cost: --clients concurrent writers commit --txs one-row business transactions\n" +
			"each variant: plain (the row alone), enqueue-1/enqueue-10 (plus 1 or 10 events\n" +
			"into the outbox table), wal-1/wal-10 (plus 1 or 10 pg_logical_emit_message\n" +
			"events). Relay: a backlog of --events events drained by wal-floor (decoded and\n" +
			"confirmed, no publish), wal (to Kafka, acked) and the table relay's\n" +
			"at-least-once; then wal-latency: commit → Kafka ack at --rate events/s.\n" +
			"Needs wal_level=logical. In-process kfake broker; scratch schemas, slots and\n" +
			"publications are dropped after.",
		Flags: func(fs *benchFlags) {
			fs.Int("clients", 8, "concurrent writers of the enqueue variants")
			fs.Int("txs", 4000, "transactions per enqueue variant")
			fs.Int("events", 200_000, "events drained by each relay variant")
			fs.Int("batch-size", 1000, "relay batch size")
			fs.Int("latency-events", 5000, "events of the wal-latency run")
			fs.Int("rate", 1000, "events per second in the wal-latency run")
		},
		Run: runBenchWAL,
	})
}

func runBenchWAL(ctx context.Context, env *benchEnv) ([]benchResult, error) {
	for _, name := range []string{"clients", "txs", "events", "batch-size", "latency-events", "rate"} {
		if *env.Ints[name] < 1 {
			return nil, cli.Usagef("--%s must be at least 1", name)
		}
	}
	if *env.Ints["batch-size"] > wal.BatchSizeMax {
		return nil, cli.Usagef("--batch-size must be at most %d", wal.BatchSizeMax)
	}
	urls, drop, err := scratchSchemas(ctx, env.DatabaseURL, "bench_wal", 2, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	pools := make([]*pgxpool.Pool, len(urls))
	for i, u := range urls {
		pu, _ := url.Parse(u)
		q := pu.Query()
		q.Set("pool_max_conns", strconv.Itoa(*env.Ints["clients"]+4))
		pu.RawQuery = q.Encode()
		if pools[i], err = cli.Connect(ctx, pu.String()); err != nil {
			return nil, err
		}
		defer pools[i].Close()
		if _, err := migrate.Up(ctx, pools[i]); err != nil {
			return nil, fmt.Errorf("migrate scratch schema: %w", err)
		}
	}
	var level string
	if err := pools[0].QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return nil, err
	}
	if level != "logical" {
		return nil, fmt.Errorf("%w (it is %s): set it on the server DATABASE_URL names", wal.ErrNotLogical, level)
	}
	res, err := benchWALEnqueue(ctx, env, pools[0])
	if err != nil {
		return nil, err
	}
	rel, err := benchWALRelay(ctx, env, urls[1], pools[1])
	if err != nil {
		return nil, err
	}
	return append(res, rel...), nil
}

// benchWALEnqueue measures the cost of an enqueue on a one-row business
// transaction: plain, enqueue-1, enqueue-10, wal-1, wal-10. The variants
// take turns in two rounds, half the transactions each, so that the load
// of a shared machine falls on all alike.
func benchWALEnqueue(ctx context.Context, env *benchEnv, pool *pgxpool.Pool) ([]benchResult, error) {
	clients, txs := *env.Ints["clients"], *env.Ints["txs"]
	if _, err := pool.Exec(ctx, "CREATE TABLE bench_item (id bigserial PRIMARY KEY, v text NOT NULL)"); err != nil {
		return nil, err
	}
	events := func(tx int, n int) []outbox.Message {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "bench.enqueue", AggregateType: "order", AggregateID: "agg-" + strconv.Itoa(tx%1000),
				EventType: "BenchEvent", Payload: []byte(`{"amount_kopecks":1000,"customer_id":"c1"}`)}
		}
		return msgs
	}
	// The WAL variants write with a prefix no relay reads.
	enq := wal.Enqueuer{Prefix: "idem.bench.unread"}
	type variant struct {
		name string
		fn   func(ctx context.Context, tx pgx.Tx, i int) error
		lat  []float64
		dur  time.Duration
		ops  int
	}
	vs := []*variant{
		{name: "plain", fn: func(context.Context, pgx.Tx, int) error { return nil }},
		{name: "enqueue-1", fn: func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := outbox.EnqueueTx(ctx, tx, events(i, 1)...)
			return err
		}},
		{name: "enqueue-10", fn: func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := outbox.EnqueueTx(ctx, tx, events(i, 10)...)
			return err
		}},
		{name: "wal-1", fn: func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := enq.EnqueueTx(ctx, tx, events(i, 1)...)
			return err
		}},
		{name: "wal-10", fn: func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := enq.EnqueueTx(ctx, tx, events(i, 10)...)
			return err
		}},
	}
	for round := range 2 {
		n := txs / 2
		if round == 1 {
			n = txs - txs/2
		}
		for _, v := range vs {
			fmt.Fprintf(env.Log, "wal: enqueue %s, round %d: %d transactions by %d clients...\n", v.name, round+1, n, clients)
			var next atomic.Int64
			lats := make([][]float64, clients)
			errs := make(chan error, clients)
			var wg sync.WaitGroup
			t0 := time.Now()
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1)) - 1
						if i >= n || ctx.Err() != nil {
							return
						}
						s := time.Now()
						err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
							if _, err := tx.Exec(ctx, "INSERT INTO bench_item (v) VALUES ($1)", "item"); err != nil {
								return err
							}
							return v.fn(ctx, tx, i)
						})
						if err != nil {
							errs <- fmt.Errorf("%s: %w", v.name, err)
							return
						}
						lats[c] = append(lats[c], float64(time.Since(s).Microseconds())/1000)
					}
				}()
			}
			wg.Wait()
			v.dur += time.Since(t0)
			close(errs)
			if err := <-errs; err != nil {
				return nil, err
			}
			for _, l := range lats {
				v.lat = append(v.lat, l...)
			}
			v.ops += n
		}
	}
	var out []benchResult
	for _, v := range vs {
		out = append(out, latencyResult(v.name, v.lat, v.ops, v.dur))
	}
	return out, nil
}

// benchCounter is a publisher that counts and acknowledges, for
// wal-floor; with next, it counts what next acknowledged.
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

// benchWALRelay drains a backlog of --events events through wal-floor, wal
// and the table relay's at-least-once, then measures wal-latency.
func benchWALRelay(ctx context.Context, env *benchEnv, dbURL string, pool *pgxpool.Pool) ([]benchResult, error) {
	events, batchSize := *env.Ints["events"], *env.Ints["batch-size"]
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	addrs := cluster.ListenAddrs()
	cl, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(addrs...),
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
	quiet := slog.New(slog.DiscardHandler)
	var b [6]byte
	_, _ = rand.Read(b[:])
	run := "bench_wal_" + hex.EncodeToString(b[:])
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
		fmt.Fprintf(env.Log, "wal: %s: draining %d events...\n", name, events)
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
		return latencyResult(name, nil, events, time.Since(t0)), nil
	}

	var out []benchResult
	for _, name := range []string{"wal-floor", "wal"} {
		c := &benchCounter{done: make(chan struct{}), want: int64(events)}
		if name == "wal" {
			c.next = pub
		}
		r, prefix, err := newRelay(name, c)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(env.Log, "wal: %s: writing a backlog of %d events...\n", name, events)
		if err := backlog(prefix, "bench.relay", events); err != nil {
			return nil, err
		}
		res, err := drain(name, r, c)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}

	// The table relay, same broker, same count: its at-least-once mode.
	fmt.Fprintf(env.Log, "wal: at-least-once: seeding and draining %d events...\n", events)
	if _, err := pool.Exec(ctx, "TRUNCATE outbox_event, outbox_aggregate"); err != nil {
		return nil, err
	}
	if err := benchRelaySeed(ctx, pool, "agg-", events, 1000, 0); err != nil {
		return nil, err
	}
	tr, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{BatchSize: batchSize, DisableNotify: true, Logger: quiet})
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
	out = append(out, latencyResult("at-least-once", nil, events, time.Since(t0)))

	lat, err := benchWALLatency(ctx, env, pool, addrs, pub, newRelay)
	if err != nil {
		return nil, fmt.Errorf("wal-latency: %w", err)
	}
	return append(out, lat), nil
}

// benchWALLatency: one event per transaction at --rate, commit → Kafka
// acknowledgement (the publisher's return), p50 and p99.
func benchWALLatency(ctx context.Context, env *benchEnv, pool *pgxpool.Pool, _ []string, pub outbox.Publisher,
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
