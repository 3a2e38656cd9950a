package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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

func init() {
	registerBench(&benchScenario{
		Name: "relay",
		Summary: "Outbox relay throughput on --events pending events over --aggregates aggregates,\n" +
			"every figure also given as a ratio to the first:\n" +
			"sql-floor (the cheapest polling relay: one unordered claim-and-mark statement\n" +
			"per batch on a table of the same columns, no publisher), sql-ceiling (the\n" +
			"relay's ordered claim and mark, no publish), per-row (the naive loop: claim,\n" +
			"one produce call, one UPDATE per row), at-least-once and two-phase (the\n" +
			"outbox.Relay modes, one publisher call per batch), backlog (at-least-once\n" +
			"while --blocked events wait behind DEAD heads or heads in backoff on\n" +
			"--blocked-aggregates other aggregates), hot-aggregate (at-least-once, all\n" +
			"events of one aggregate), retained (at-least-once after --retained PUBLISHED\n" +
			"events kept for retention) and purge (deleting those retained rows with\n" +
			"Relay.Purge, rows/s); then notify-latency: commit → Kafka latency at --rate\n" +
			"events/s with LISTEN/NOTIFY wake-up (poll interval 1s). Then the WAL outbox\n" +
			"(package outbox/wal): wal-floor (--wal-events events read raw from the slot:\n" +
			"pgoutput with the relay's options, acknowledged, nothing decoded or published:\n" +
			"the limit), wal (the same backlog size to Kafka, acknowledged, 2 rounds\n" +
			"interleaved with wal-floor; its ratio is to wal-floor, and the log gives it over\n" +
			"at-least-once too) and wal-latency (commit → Kafka ack at --rate events/s).\n" +
			"A floor is checked: if any variant beats sql-floor, or wal beats wal-floor, by\n" +
			"more than the run's noise (the spread of 2 interleaved rounds), the bench prints\n" +
			"FLOOR BEATEN naming both and exits 1.\n" +
			"The wal-* results need wal_level=logical on the server: without it they are\n" +
			"skipped with one line and the rest runs (an explicit --wal makes it an error;\n" +
			"--wal=false leaves them out). In-process kfake broker,\n" +
			"scratch schemas, slots and publications (dropped after).",
		Flags: func(fs *benchFlags) {
			fs.Int("events", 100_000, "events drained by each throughput variant")
			fs.Int("aggregates", 1000, "aggregates the events are spread over")
			fs.Int("batch-size", 1000, "relay batch size")
			fs.Int("blocked", 100_000, "blocked events of the backlog variant")
			fs.Int("blocked-aggregates", 1000, "aggregates the blocked events are spread over (half DEAD heads, half heads in backoff)")
			fs.Int("retained", 1_000_000, "PUBLISHED events kept in the retained variant's table")
			fs.Int("latency-events", 5000, "events of the notify-latency run")
			fs.Int("rate", 1000, "events per second in the notify-latency and wal-latency runs")
			fs.Int("wal-events", 200_000, "events drained by wal-floor and wal")
			fs.Bool("wal", true, "run the WAL outbox's results wal-floor, wal, wal-latency (need wal_level=logical); false leaves them out")
		},
		Run: runBenchRelay,
	})
}

type benchNopPublisher struct{}

func (benchNopPublisher) Publish(context.Context, []outbox.Event) error { return nil }

type benchFailPublisher struct{}

func (benchFailPublisher) Publish(context.Context, []outbox.Event) error {
	return errors.New("bench: blocked on purpose")
}

// benchRelayVariants are the throughput variants, in report order.
var benchRelayVariants = []string{"sql-floor", "sql-ceiling", "per-row", "at-least-once", "two-phase", "backlog", "hot-aggregate", "retained"}

func runBenchRelay(ctx context.Context, env *benchEnv) ([]benchResult, error) {
	events, aggregates, batchSize := *env.Ints["events"], *env.Ints["aggregates"], *env.Ints["batch-size"]
	blocked, blockedAggs, retained := *env.Ints["blocked"], *env.Ints["blocked-aggregates"], *env.Ints["retained"]
	latEvents, rate := *env.Ints["latency-events"], *env.Ints["rate"]
	for name, v := range map[string]int{"events": events, "aggregates": aggregates, "batch-size": batchSize,
		"latency-events": latEvents, "rate": rate, "blocked-aggregates": blockedAggs} {
		if v < 1 {
			return nil, cli.Usagef("--%s must be at least 1", name)
		}
	}
	for name, v := range map[string]int{"blocked": blocked, "retained": retained} {
		if v < 0 {
			return nil, cli.Usagef("--%s must not be negative", name)
		}
	}
	if blocked > 0 && blocked < blockedAggs {
		return nil, cli.Usagef("--blocked must be 0 or at least --blocked-aggregates")
	}
	if batchSize > 100_000 {
		return nil, cli.Usagef("--batch-size must be at most 100000")
	}
	withWAL := *env.Bools["wal"]
	if withWAL {
		if *env.Ints["wal-events"] < 1 {
			return nil, cli.Usagef("--wal-events must be at least 1")
		}
		if batchSize > wal.BatchSizeMax {
			return nil, cli.Usagef("--batch-size must be at most %d with the WAL results (or --wal=false)", wal.BatchSizeMax)
		}
	}

	// Scratch schemas: one per throughput variant, one for the latency
	// run (the writers of the latency run get their own URL on it, with
	// synchronous_commit off) and one for the WAL results.
	nv := len(benchRelayVariants)
	urls, drop, err := scratchSchemas(ctx, env.DatabaseURL, "bench_relay", nv+2, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	if u, err := url.Parse(urls[0]); err == nil {
		fmt.Fprintf(env.Log, "relay: scratch schemas %s…\n", strings.TrimSuffix(u.Query().Get("search_path"), "0"))
	}
	poolOn := func(i, maxConns int, syncOff bool) (*pgxpool.Pool, error) {
		u, _ := url.Parse(urls[i])
		q := u.Query()
		q.Set("pool_max_conns", strconv.Itoa(maxConns))
		if syncOff {
			q.Set("synchronous_commit", "off")
		}
		u.RawQuery = q.Encode()
		return cli.Connect(ctx, u.String())
	}
	newPool := func(i, maxConns int) (*pgxpool.Pool, error) {
		pool, err := poolOn(i, maxConns, false)
		if err != nil {
			return nil, err
		}
		if _, err := migrate.Up(ctx, pool); err != nil {
			pool.Close()
			return nil, fmt.Errorf("migrate scratch schema: %w", err)
		}
		return pool, nil
	}

	// The WAL results need a logical server: find out before the table
	// variants spend minutes.
	var walPool *pgxpool.Pool
	if withWAL {
		if walPool, err = newPool(nv+1, 20); err != nil {
			return nil, err
		}
		defer walPool.Close()
		if withWAL, err = benchWALWanted(ctx, env, walPool, "bench relay: wal-floor, wal and wal-latency"); err != nil {
			return nil, err
		}
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	addrs := cluster.ListenAddrs()
	// Batches of small records to an in-process broker: compression would
	// only burn the CPU the broker and PostgreSQL share with the relay.
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
	newRelay := func(pool *pgxpool.Pool, mode outbox.Mode, p outbox.Publisher) (func(context.Context) (int, error), error) {
		r, err := outbox.NewRelay(pool, p, &outbox.RelayConfig{Mode: mode, BatchSize: batchSize, DisableNotify: true, Logger: quiet})
		if err != nil {
			return nil, err
		}
		return r.RunBatch, nil
	}
	type variant struct {
		name  string
		pool  *pgxpool.Pool
		batch func(context.Context) (int, error)
		// figures
		lat     []float64
		counts  []int // events of each batch, beside lat
		elapsed time.Duration
		total   int
		done    bool
	}
	var vs []*variant
	for i, name := range benchRelayVariants {
		pool, err := newPool(i, 4)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		v := &variant{name: name, pool: pool}
		switch name {
		case "sql-floor":
			v.batch = func(ctx context.Context) (int, error) { return benchFloorBatch(ctx, pool, batchSize) }
		case "sql-ceiling":
			v.batch, err = newRelay(pool, outbox.AtLeastOnce, benchNopPublisher{})
		case "per-row":
			v.batch = func(ctx context.Context) (int, error) { return benchPerRowBatch(ctx, pool, cl, batchSize) }
		case "two-phase":
			v.batch, err = newRelay(pool, outbox.TwoPhase, pub)
		default: // at-least-once, backlog, hot-aggregate, retained
			v.batch, err = newRelay(pool, outbox.AtLeastOnce, pub)
		}
		if err != nil {
			return nil, err
		}
		aggs := aggregates
		if name == "hot-aggregate" {
			aggs = 1
		}
		fmt.Fprintf(env.Log, "relay: %s: seeding %d events...\n", name, events)
		if _, err := pool.Exec(ctx, "TRUNCATE outbox_event, outbox_aggregate"); err != nil {
			return nil, err
		}
		switch name {
		case "backlog":
			if err := benchRelaySeedBlocked(ctx, pool, blocked, blockedAggs, quiet); err != nil {
				return nil, fmt.Errorf("%s: seed blocked: %w", name, err)
			}
		case "retained":
			if err := benchRelaySeedRetained(ctx, pool, retained); err != nil {
				return nil, fmt.Errorf("%s: seed retained: %w", name, err)
			}
		}
		if err := benchRelaySeed(ctx, pool, "agg-", events, aggs, 0); err != nil {
			return nil, fmt.Errorf("%s: seed: %w", name, err)
		}
		vs = append(vs, v)
	}
	// The variants take turns, one batch each, so that the load of a
	// shared machine falls on all of them alike; each variant's rate is its
	// events over the time spent in its own batches.
	fmt.Fprintf(env.Log, "relay: draining %d events per variant, batches interleaved...\n", events)
	for active := len(vs); active > 0; {
		for _, v := range vs {
			if v.done {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			t0 := time.Now()
			k, err := v.batch(ctx)
			d := time.Since(t0)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			v.elapsed += d
			if k == 0 {
				v.done = true
				active--
				continue
			}
			v.lat = append(v.lat, float64(d.Microseconds())/1000)
			v.counts = append(v.counts, k)
			v.total += k
		}
	}
	var results []benchResult
	for _, v := range vs {
		var published int
		if err := v.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED' AND aggregate_id LIKE 'agg-%'").Scan(&published); err != nil {
			return nil, err
		}
		// A batch whose claim outlasted its publish budget (a starved
		// machine) claims events again later: claims may exceed events,
		// never fall short of them.
		if published != events || v.total < events {
			return nil, fmt.Errorf("%s: published %d (claimed %d) of %d events", v.name, published, v.total, events)
		}
		results = append(results, latencyResult(v.name, v.lat, events, v.elapsed))
	}
	// sql-floor is a floor: no variant beats it by more than the run's
	// noise. The batches were interleaved; the rounds are consecutive
	// runs of each variant's batches, benchFloorRounds of them, which ran
	// in the same stretches of time for every variant.
	rounds := map[string][]float64{}
	var subjects []string
	for _, v := range vs {
		rounds[v.name] = benchBatchRounds(v.counts, v.lat, benchFloorRounds)
		if v.name != "sql-floor" {
			subjects = append(subjects, v.name)
		}
	}
	fmt.Fprintf(env.Log, "relay: sql-floor: rounds %s events/s\n", benchRates(rounds["sql-floor"]))
	if err := benchFloorCheck(env.Log, "sql-floor", rounds, subjects); err != nil {
		return nil, err
	}
	// purge: the retained variant's PUBLISHED rows deleted by the relay's
	// own retention purge (everything older than a minute).
	purge, err := benchRelayPurge(ctx, vs[slices.IndexFunc(vs, func(v *variant) bool { return v.name == "retained" })].pool, quiet)
	if err != nil {
		return nil, fmt.Errorf("purge: %w", err)
	}
	results = append(results, purge)

	latPool, err := newPool(nv, 8)
	if err != nil {
		return nil, err
	}
	defer latPool.Close()
	// The writers commit with synchronous_commit off, so that the load
	// generator reaches the rate on a slow disk; NOTIFY still goes out at
	// commit, and the relay's own pool commits synchronously.
	writerPool, err := poolOn(nv, 40, true)
	if err != nil {
		return nil, err
	}
	defer writerPool.Close()
	fmt.Fprintf(env.Log, "relay: notify-latency: %d events at %d/s...\n", latEvents, rate)
	res, err := benchRelayLatency(ctx, latPool, writerPool, addrs, pub, latEvents, rate, quiet)
	if err != nil {
		return nil, fmt.Errorf("notify-latency: %w", err)
	}
	results = append(results, res)
	if withWAL {
		we := *env.Ints["wal-events"]
		env := *env
		env.Ints = maps.Clone(env.Ints)
		env.Ints["events"] = &we
		walRes, err := benchWALRelay(ctx, &env, urls[nv+1], walPool, pub)
		if err != nil {
			return nil, err
		}
		results = append(results, walRes...)
	}
	benchRelayRatios(env.Log, results)
	benchWALRatios(env.Log, results)
	return results, nil
}

// benchRelayRatios sets every throughput result's ratio to sql-floor and
// prints the targets, met or missed, on the log.
func benchRelayRatios(log io.Writer, results []benchResult) {
	ops := map[string]float64{}
	for _, r := range results {
		ops[r.Name] = r.OpsPerSec
	}
	floor := ops["sql-floor"]
	for i := range results {
		switch results[i].Name {
		case "notify-latency", "purge", "wal-latency":
			continue
		}
		if floor > 0 {
			results[i].Ratio = results[i].OpsPerSec / floor
		}
	}
	for _, t := range []struct {
		name, base string
		min        float64
	}{
		{"at-least-once", "sql-floor", 0.7},
		{"two-phase", "sql-floor", 0.6},
		{"backlog", "at-least-once", 0.8},
		{"hot-aggregate", "at-least-once", 0.7},
		{"retained", "at-least-once", 0.8},
	} {
		if ops[t.base] == 0 {
			continue
		}
		got := ops[t.name] / ops[t.base]
		verdict := "met"
		if got < t.min {
			verdict = "MISSED"
		}
		fmt.Fprintf(log, "relay: %s / %s = %.2f (target ≥ %.2f: %s)\n", t.name, t.base, got, t.min, verdict)
	}
}

// benchRelaySeed inserts n PENDING events directly, over aggregates named
// prefix0, prefix1…, starting at sequence from+1 (one statement;
// EnqueueTx's numbering is reproduced by the arithmetic), and analyzes.
func benchRelaySeed(ctx context.Context, pool *pgxpool.Pool, prefix string, n, aggregates, from int) error {
	a := strconv.Itoa(aggregates)
	evPrefix := prefix + strconv.Itoa(from) + "-ev-"
	for _, q := range []string{
		`INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload)
		 SELECT 'bench.relay', 'order', '` + prefix + `' || (g % ` + a + `), ` + strconv.Itoa(from) + ` + g / ` + a + ` + 1,
		        '` + evPrefix + `' || g, 'BenchEvent', convert_to(repeat('x', 100), 'UTF8')
		 FROM generate_series(0, ` + strconv.Itoa(n-1) + `) g`,
		`INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq)
		 SELECT aggregate_type, aggregate_id, max(aggregate_seq) FROM outbox_event
		 WHERE aggregate_id LIKE '` + prefix + `%' GROUP BY 1, 2
		 ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = EXCLUDED.last_seq`,
		"VACUUM ANALYZE outbox_event",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// benchRelaySeedBlocked leaves n events blocked on aggregates aggregates
// ("blk-…"), the way a relay leaves them: the events are written, then
// their heads are handed to a relay whose publisher fails every event,
// with one attempt allowed for the first half of the aggregates (their
// heads go DEAD) and with a backoff of a day for the second half. The
// blocked rows get lower ids than the ready load, so an id-ordered scan
// meets them first.
func benchRelaySeedBlocked(ctx context.Context, pool *pgxpool.Pool, n, aggregates int, quiet *slog.Logger) error {
	if n == 0 {
		return nil
	}
	dead := aggregates / 2
	for _, part := range []struct {
		prefix string
		aggs   int
		cfg    outbox.RelayConfig
	}{
		{"blk-dead-", dead, outbox.RelayConfig{MaxAttempts: 1}},
		{"blk-wait-", aggregates - dead, outbox.RelayConfig{MaxAttempts: 100, BackoffMin: 24 * time.Hour, BackoffMax: 48 * time.Hour}},
	} {
		if part.aggs == 0 {
			continue
		}
		if err := benchRelaySeed(ctx, pool, part.prefix, n*part.aggs/aggregates, part.aggs, 0); err != nil {
			return err
		}
		// A batch of exactly as many events as there are heads claims the
		// heads and no run behind them.
		cfg := part.cfg
		cfg.BatchSize, cfg.DisableNotify, cfg.Logger = part.aggs, true, quiet
		r, err := outbox.NewRelay(pool, benchFailPublisher{}, &cfg)
		if err != nil {
			return err
		}
		if k, _ := r.RunBatch(ctx); k != part.aggs { // every event fails: the error is the point
			return fmt.Errorf("blocked heads: %d of %d failed", k, part.aggs)
		}
	}
	// Full jitter may have drawn a backoff of seconds: push every one a
	// day out, so that no blocked head comes due during the run.
	_, err := pool.Exec(ctx, `UPDATE outbox_event SET available_at = now() + interval '1 day'
		WHERE aggregate_id LIKE 'blk-wait-%' AND status = 'PENDING' AND attempts > 0`)
	return err
}

// benchRelaySeedRetained inserts n PUBLISHED events, published a day ago,
// over aggregates of their own ("old-…").
func benchRelaySeedRetained(ctx context.Context, pool *pgxpool.Pool, n int) error {
	if n == 0 {
		return nil
	}
	_, err := pool.Exec(ctx, `INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload,
		status, attempts, published_at, created_at)
		SELECT 'bench.relay', 'order', 'old-' || (g % 1000), g / 1000 + 1, 'old-ev-' || g, 'BenchEvent',
		       convert_to(repeat('x', 100), 'UTF8'), 'PUBLISHED', 1, now() - interval '1 day', now() - interval '1 day'
		FROM generate_series(0, `+strconv.Itoa(n-1)+`) g`)
	return err
}

// benchRelayPurge deletes the retained variant's PUBLISHED rows older than
// a minute with Relay.Purge and reports rows deleted per second.
func benchRelayPurge(ctx context.Context, pool *pgxpool.Pool, quiet *slog.Logger) (benchResult, error) {
	r, err := outbox.NewRelay(pool, benchNopPublisher{}, &outbox.RelayConfig{Retention: time.Minute, DisableNotify: true, Logger: quiet})
	if err != nil {
		return benchResult{}, err
	}
	t0 := time.Now()
	n, err := r.Purge(ctx)
	d := time.Since(t0)
	if err != nil {
		return benchResult{}, err
	}
	return latencyResult("purge", []float64{float64(d.Microseconds()) / 1000}, int(n), d), nil
}

// benchFloorBatch is the floor every relay is measured against: one
// autocommitted statement claims up to batchSize PENDING rows in no
// particular order and marks them PUBLISHED, returning what a publisher
// would need. No order, no publish, no second round trip.
func benchFloorBatch(ctx context.Context, pool *pgxpool.Pool, batchSize int) (int, error) {
	rows, err := pool.Query(ctx, `UPDATE outbox_event e SET status = 'PUBLISHED', published_at = now()
		FROM (SELECT id FROM outbox_event WHERE published_at IS NULL AND status = 'PENDING'
		      LIMIT $1 FOR UPDATE SKIP LOCKED) c
		WHERE e.id = c.id
		RETURNING e.id, e.topic, e.aggregate_type, e.aggregate_id, e.aggregate_seq, e.event_id, e.event_type, e.payload, e.headers`, batchSize)
	if err != nil {
		return 0, err
	}
	n := 0
	for rows.Next() {
		var id, seq int64
		var topic, typ, agg, eventID, eventType string
		var payload, headers []byte
		if err := rows.Scan(&id, &topic, &typ, &agg, &seq, &eventID, &eventType, &payload, &headers); err != nil {
			rows.Close()
			return 0, err
		}
		n++
	}
	return n, rows.Err()
}

// benchPerRowBatch is the naive relay loop, the one a first outbox is
// usually written as: claim with FOR UPDATE SKIP LOCKED, one produce call
// for the batch, then one UPDATE per row, all in one transaction. Raw SQL: it is the baseline, not the package's code.
func benchPerRowBatch(ctx context.Context, pool *pgxpool.Pool, cl *kgo.Client, batchSize int) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	rows, err := tx.Query(ctx, `SELECT id, topic, aggregate_id, event_id, payload FROM outbox_event
		WHERE status = 'PENDING' ORDER BY created_at, id LIMIT $1 FOR UPDATE SKIP LOCKED`, batchSize)
	if err != nil {
		return 0, err
	}
	var ids []int64
	var recs []*kgo.Record
	for rows.Next() {
		var id int64
		var topic, agg, eventID string
		var payload []byte
		if err := rows.Scan(&id, &topic, &agg, &eventID, &payload); err != nil {
			return 0, err
		}
		ids = append(ids, id)
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(agg), Value: payload,
			Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte(eventID)}}})
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, tx.Commit(ctx)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, err
	}
	for _, id := range ids {
		if _, err := tx.Exec(ctx, `UPDATE outbox_event SET status = 'PUBLISHED', published_at = now() WHERE id = $1`, id); err != nil {
			return 0, err
		}
	}
	return len(ids), tx.Commit(ctx)
}

// benchRelayLatency runs a started relay (LISTEN/NOTIFY, 1 s poll) while
// 32 writers commit one event per transaction at rate events/s in
// total; a consumer notes when each event arrives. Latency is arrival
// minus the moment Commit returned.
func benchRelayLatency(ctx context.Context, pool, writers *pgxpool.Pool, addrs []string, pub outbox.Publisher, n, rate int, quiet *slog.Logger) (benchResult, error) {
	if _, err := pool.Exec(ctx, "TRUNCATE outbox_event, outbox_aggregate"); err != nil {
		return benchResult{}, err
	}
	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Logger: quiet})
	if err != nil {
		return benchResult{}, err
	}
	if err := relay.Start(ctx); err != nil {
		return benchResult{}, err
	}
	defer func() { _ = relay.Stop(context.WithoutCancel(ctx)) }()
	consumer, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("bench.latency"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return benchResult{}, err
	}
	defer consumer.Close()

	committed := make([]time.Time, n)
	arrived := make([]time.Time, n)
	var mu sync.Mutex
	warm := make(chan struct{})
	all := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	consumerDone := make(chan struct{})
	go func() {
		defer close(consumerDone)
		got := 0
		for cctx.Err() == nil {
			fs := consumer.PollFetches(cctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				id := ""
				for _, h := range r.Headers {
					if h.Key == kafka.HeaderEventID {
						id = string(h.Value)
					}
				}
				if id == "warm" {
					close(warm)
					return
				}
				i, err := strconv.Atoi(strings.TrimPrefix(id, "lat-"))
				if err != nil || i < 0 || i >= n {
					return
				}
				mu.Lock()
				if arrived[i].IsZero() {
					arrived[i] = now
					if got++; got == n {
						close(all)
					}
				}
				mu.Unlock()
			})
		}
	}()
	// Each event is its own transaction: Enqueue on the pool runs one
	// autocommitted statement, so "commit" is when it returns.
	enq := func(id string) (time.Time, error) {
		_, err := outbox.Enqueue(ctx, writers, outbox.Message{Topic: "bench.latency", AggregateType: "order",
			AggregateID: id, EventID: id, EventType: "BenchEvent", Payload: []byte("x")})
		return time.Now(), err
	}
	// Warm-up: the consumer has its partitions and the listener is up.
	if _, err := enq("warm"); err != nil {
		return benchResult{}, err
	}
	select {
	case <-warm:
	case <-time.After(30 * time.Second):
		return benchResult{}, errors.New("warm-up event did not arrive")
	}

	// Enough writers to keep up with the rate on a loaded machine.
	const nWriters = 32
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
				at, err := enq("lat-" + strconv.Itoa(i))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				committed[i] = at
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	produced := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return benchResult{}, err
	}
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		return benchResult{}, errors.New("not every event arrived within 60s")
	}
	cancel()
	<-consumerDone
	lat := make([]float64, n)
	for i := range n {
		lat[i] = max(0, float64(arrived[i].Sub(committed[i]).Microseconds())/1000)
	}
	return latencyResult("notify-latency", lat, n, produced), nil
}
