package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/migrate"
	idemotel "github.com/idemkit/idem/otel"
	"github.com/idemkit/idem/redisstore"
)

func init() {
	registerBench(&benchScenario{
		Name: "http",
		Summary: "Idempotency-Key middleware over PostgreSQL, 32 concurrent clients over loopback.\n" +
			"sql-two-step: exactly the statements and commits two-step issues per request\n" +
			"  (claim, the handler's one-row INSERT, completion), through pgx, no HTTP;\n" +
			"two-step: the middleware in ModeTwoStep; transactional: ModeTransactional\n" +
			"  (claim, handler row and response in one commit); replay: repeats of\n" +
			"  completed keys; two-step-traced: two-step with OpenTelemetry tracing and\n" +
			"  metrics on (idemotel's hook and traceparent extraction, SDK tracer with a\n" +
			"  batch processor to a discarding exporter, SDK meter), its cost against\n" +
			"  two-step in the same run; sql-transactional: transactional over\n" +
			"  database/sql (pgx's stdlib driver, NewSQLStore), its ratio to transactional.\n" +
			"  Every request carries a traceparent. Every\n" +
			"  handler run writes one row. Scratch schema (dropped after).\n" +
			"With --store redis (or a redis:// URL), in the same rounds: redis-two-step, the\n" +
			"  same two-step middleware and handler (its row still in PostgreSQL) over the\n" +
			"  Redis store; postgres-replay and redis-replay, replays with the in-process\n" +
			"  replay cache off, so that each reads its store (replay measures the cache).\n" +
			"  Redis keys under {idembench-RUN}:, expiring after 10 min.\n" + benchAdapterSummary + benchFiberSummary,
		Flags: func(fs *benchFlags) {
			fs.String("store", "postgres", "postgres (the variants above only), or redis / a redis:// URL: add the Redis store's variants")
			fs.Int("seconds", 10, "measured seconds per variant, split over the rounds")
			fs.Int("rounds", 5, "interleaved rounds: every round runs every variant once")
			fs.Int("clients", 32, "concurrent clients")
			fs.Bool("fiber", false, "add the http-vs-fiber comparison: plain, fiber-plain, fiber-pg, fiber-pg-replay, fiber-tx-replay (and postgres-replay without --store redis)")
		},
		Run: runBenchHTTP,
	})
}

// benchTraceparent is the caller's trace context every request carries
// (only the traced variant reads it).
const benchTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

const benchHTTPBody = `{"amount_kopecks":1000,"customer_id":"c1","note":"bench"}`

func runBenchHTTP(ctx context.Context, env *benchEnv) ([]benchResult, error) {
	seconds, clients, rounds := *env.Ints["seconds"], *env.Ints["clients"], *env.Ints["rounds"]
	if rounds < 1 {
		return nil, cli.Usagef("--rounds must be at least 1")
	}
	if seconds < 1 {
		return nil, cli.Usagef("--seconds must be at least 1")
	}
	if clients < 1 {
		return nil, cli.Usagef("--clients must be at least 1")
	}
	dur := time.Duration(seconds) * time.Second
	withFiber := env.Bools["fiber"] != nil && *env.Bools["fiber"]
	storeSpec := *env.Strings["store"]
	withRedis := storeSpec == "redis" || redisstore.IsURL(storeSpec)
	if !withRedis && storeSpec != "postgres" {
		return nil, cli.Usagef("--store %q: want postgres, redis or a redis:// URL", cli.Redact(storeSpec))
	}
	// The Redis store first: a bad URL or a server that cannot be reached
	// fails before PostgreSQL is touched.
	var redisStore idempotency.Store
	if withRedis {
		run := uniqueRun()
		st, err := openStore(ctx, storeSpec, "", "{idembench-"+run+"}:", slog.New(slog.NewTextHandler(env.Log, nil)))
		if err != nil {
			return nil, err
		}
		defer st.close()
		redisStore = st.store
	}

	urls, drop, err := scratchSchemas(ctx, env.DatabaseURL, "bench_http", 1, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	pcfg, err := pgxpool.ParseConfig(urls[0])
	if err != nil {
		return nil, cli.Usagef("database URL is malformed")
	}
	// One connection per client: in transactional mode a request holds its
	// connection for the whole handler, and no variant should queue on the
	// pool instead of the database.
	pcfg.MaxConns = int32(clients)
	pcfg.MinConns = int32(clients)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool); err != nil {
		return nil, fmt.Errorf("migrate scratch schema: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_http_row (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text NOT NULL)`); err != nil {
		return nil, err
	}
	store := idempotency.NewPostgresStore(pool)

	// The handler of every variant writes one row: through the request
	// transaction in transactional mode, else through the pool.
	writeRow := func(ctx context.Context, tx bool) (int64, error) {
		var id int64
		var err error
		if t, ok := idempotency.TxFromContext(ctx); tx && ok {
			err = t.QueryRow(ctx, `INSERT INTO bench_http_row (body) VALUES ($1) RETURNING id`, benchHTTPBody).Scan(&id)
		} else {
			err = pool.QueryRow(ctx, `INSERT INTO bench_http_row (body) VALUES ($1) RETURNING id`, benchHTTPBody).Scan(&id)
		}
		return id, err
	}
	handler := func(tx bool) http.Handler {
		return benchRowHandler(func(ctx context.Context) (int64, error) { return writeRow(ctx, tx) })
	}
	scope := func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }
	twoStep, err := idempotency.New(store, &idempotency.Config{Scope: scope})
	if err != nil {
		return nil, err
	}
	transactional, err := idempotency.New(store, &idempotency.Config{Scope: scope, Mode: idempotency.ModeTransactional})
	if err != nil {
		return nil, err
	}
	// Tracing on: the same two-step middleware with idemotel's hook, behind
	// its traceparent extraction, over the SDK (every span sampled and
	// exported in batches, to an exporter that drops them) and an SDK
	// meter.
	spans := &discardSpans{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.WithoutCancel(ctx)) }()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() { _ = mp.Shutdown(context.WithoutCancel(ctx)) }()
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		return nil, err
	}
	traced, err := idempotency.New(store, &idempotency.Config{Scope: scope, Hook: tel.RequestHook()})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /two-step/rows", twoStep.Wrap(handler(false)))
	mux.Handle("POST /traced/rows", tel.Handler(traced.Wrap(handler(false))))
	mux.Handle("POST /transactional/rows", transactional.Wrap(handler(true)))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown(context.WithoutCancel(ctx)) }()
	// The load generator is a lean HTTP/1.1 keep-alive client (one
	// connection per client, requests written by hand, responses parsed by
	// net/http), like wrk or hey rather than net/http's Transport: client
	// and server share the machine, and the figures should be the server's.
	addr := ln.Addr().String()
	conns := newBenchConns(addr, clients)
	defer conns.close()

	run := uniqueRun()
	var seq atomic.Int64
	newKey := func() string { return run + "-" + strconv.FormatInt(seq.Add(1), 10) }
	send := func(ctx context.Context, path, key string, want int) error {
		return conns.post(ctx, path, key, want)
	}

	resp201 := &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}}
	variants := []benchVariant{
		{name: "sql-two-step", op: func(ctx context.Context) error {
			// Exactly what ModeTwoStep issues per request, each statement
			// in its own implicit transaction: the claim, the handler's
			// INSERT, the completion.
			c := idempotency.Claim{
				Key:         idempotency.HashKey("bench", http.MethodPost, "POST /sql/rows", newKey()),
				Fingerprint: idempotency.Fingerprint(idempotency.HashKey("fp", "", "", benchHTTPBody)),
				Lease:       idempotency.LeaseDefault, Retention: idempotency.RetentionDefault,
			}
			res, err := store.Claim(ctx, c)
			if err != nil {
				return err
			}
			if res.Outcome != idempotency.OutcomeClaimed {
				return fmt.Errorf("claim outcome %v", res.Outcome)
			}
			id, err := writeRow(ctx, false)
			if err != nil {
				return err
			}
			r := *resp201
			r.Body = fmt.Appendf(nil, `{"id":%d,"status":"NEW"}`, id)
			return store.Complete(ctx, c.Key, res.Fence, &r, idempotency.RetentionDefault)
		}},
		{name: "two-step", op: func(ctx context.Context) error {
			return send(ctx, "/two-step/rows", newKey(), http.StatusCreated)
		}},
		{name: "transactional", op: func(ctx context.Context) error {
			return send(ctx, "/transactional/rows", newKey(), http.StatusCreated)
		}},
	}
	// sql-transactional, beside transactional: the same over database/sql.
	sqlTx, closeSQLTx, err := benchSQLTransactional(urls[0], clients, mux, scope, newKey, conns)
	if err != nil {
		return nil, err
	}
	defer closeSQLTx()
	variants = append(variants, sqlTx)
	// replay: repeats of keys completed beforehand (each written once).
	const replayKeys = 1000
	replay := make([]string, replayKeys)
	var replayNext atomic.Int64
	variants = append(variants, benchVariant{name: "replay", prep: func(ctx context.Context) error {
		var wg sync.WaitGroup
		errs := make([]error, clients)
		for c := range clients {
			wg.Go(func() {
				for i := c; i < replayKeys && errs[c] == nil; i += clients {
					replay[i] = newKey()
					errs[c] = send(ctx, "/two-step/rows", replay[i], http.StatusCreated)
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}, op: func(ctx context.Context) error {
		return send(ctx, "/two-step/rows", replay[replayNext.Add(1)%replayKeys], http.StatusCreated)
	}})
	variants = append(variants, benchVariant{name: "two-step-traced", op: func(ctx context.Context) error {
		return send(ctx, "/traced/rows", newKey(), http.StatusCreated)
	}})

	if withRedis {
		rv, err := benchRedisVariants(redisStore, clients, mux, handler(false), store, scope, newKey, conns)
		if err != nil {
			return nil, err
		}
		variants = append(variants, rv...)
	}
	if withFiber {
		// plain: the same handler and row, no middleware, the baseline of
		// idem's side of the comparison.
		mux.Handle("POST /plain/rows", handler(false))
		if !withRedis {
			// postgres-replay, as with --store redis: replays that read
			// PostgreSQL, as every Fiber replay does.
			mw, err := idempotency.New(store, &idempotency.Config{Scope: scope, Retention: 10 * time.Minute, ReplayCacheBytes: -1})
			if err != nil {
				return nil, err
			}
			mux.Handle("POST /pg-nocache/rows", mw.Wrap(handler(false)))
		}
	}
	av, fv, stopAdapters, err := benchAdapterVariants(ctx, mux, pool, store, scope, newKey, clients, conns, withFiber)
	if err != nil {
		return nil, err
	}
	defer stopAdapters()
	variants = append(variants, av...)
	if withFiber {
		variants = append(variants, benchVariant{name: "plain", op: func(ctx context.Context) error {
			return send(ctx, "/plain/rows", newKey(), http.StatusCreated)
		}})
		variants = append(variants, fv...)
		if !withRedis {
			variants = append(variants, benchReplayVariant("postgres-replay", "/pg-nocache/rows", clients, newKey, conns))
		}
	}

	// The machine is shared: background load drifts. So the variants run
	// interleaved, in rounds, each round giving every variant an equal
	// slice, and the figures add up the rounds: a drift hits all variants
	// alike, which keeps the ratios honest.
	for _, v := range variants {
		if v.prep != nil {
			if err := v.prep(ctx); err != nil {
				return nil, fmt.Errorf("%s: prepare: %w", v.name, err)
			}
		}
	}
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
	byName := map[string]benchResult{}
	for i, v := range variants {
		r := samples[i].result(v.name)
		fmt.Fprintf(env.Log, "http: %s: %.0f ops/s, p50 %.2f ms, p99 %.2f ms\n", r.Name, r.OpsPerSec, r.P50Ms, r.P99Ms)
		results = append(results, r)
		byName[r.Name] = r
	}
	// The traced variant must have traced: its spans reached the exporter.
	if err := tp.ForceFlush(ctx); err != nil {
		return nil, fmt.Errorf("two-step-traced: flush: %w", err)
	}
	if spans.n.Load() == 0 {
		return nil, errors.New("two-step-traced: no span was exported")
	}
	if base := byName["two-step"].OpsPerSec; base > 0 {
		fmt.Fprintf(env.Log, "http: tracing on/off (two-step-traced/two-step): %.3f\n", byName["two-step-traced"].OpsPerSec/base)
	}
	benchSQLTransactionalRatio(env.Log, byName)
	benchAdapterRatios(env.Log, results)
	benchFiberRatios(env.Log, results)
	return results, nil
}

// discardSpans is a span exporter that counts and drops.
type discardSpans struct{ n atomic.Int64 }

func (d *discardSpans) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	d.n.Add(int64(len(spans)))
	return nil
}

func (d *discardSpans) Shutdown(context.Context) error { return nil }

// benchVariant is one measured variant of a scenario: prep runs once
// before the rounds, op once per operation.
type benchVariant struct {
	name string
	prep func(ctx context.Context) error
	op   func(ctx context.Context) error
}

// benchRedisVariants are redis-two-step, postgres-replay and
// redis-replay, served by the same server on routes of their own:
//
//   - redis-two-step: the two-step middleware over the Redis store at spec,
//     in front of the same handler as two-step (its row in PostgreSQL);
//   - postgres-replay and redis-replay: repeats of completed keys with the
//     middleware's in-process replay cache off, so that every replay reads
//     its store (PostgreSQL, Redis); replay, with the cache on, measures
//     the cache whatever the store.
//
// benchRowHandler is every bench variant's handler: it drains the body,
// writes one row with write and answers 201 with the row's id and
// Location, the same bytes for every variant (500 with the error when the
// write fails).
func benchRowHandler(write func(context.Context) (int64, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id, err := write(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/rows/"+strconv.FormatInt(id, 10))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"status":"NEW"}`, id)
	})
}

// The Redis records expire after 10 minutes.
func benchRedisVariants(rs idempotency.Store, clients int, mux *http.ServeMux, h http.Handler,
	pg idempotency.Store, scope func(*http.Request) (string, error), newKey func() string, conns *benchConns) ([]benchVariant, error) {
	for _, m := range []struct {
		path  string
		store idempotency.Store
		cache int64
	}{{"/redis/rows", rs, 0}, {"/redis-nocache/rows", rs, -1}, {"/pg-nocache/rows", pg, -1}} {
		mw, err := idempotency.New(m.store, &idempotency.Config{Scope: scope, Retention: 10 * time.Minute, ReplayCacheBytes: m.cache})
		if err != nil {
			return nil, err
		}
		mux.Handle("POST "+m.path, mw.Wrap(h))
	}
	return []benchVariant{
		{name: "redis-two-step", op: func(ctx context.Context) error {
			return conns.post(ctx, "/redis/rows", newKey(), http.StatusCreated)
		}},
		benchReplayVariant("postgres-replay", "/pg-nocache/rows", clients, newKey, conns),
		benchReplayVariant("redis-replay", "/redis-nocache/rows", clients, newKey, conns),
	}, nil
}

func uniqueRun() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// benchSamples accumulates one variant's rounds.
type benchSamples struct {
	lat     []time.Duration
	elapsed time.Duration
	// meter, when set, is read as the measured part of each load begins
	// and ends; cpuSelf, cpuDB, acquires and waited add up the
	// differences.
	meter            *cpuMeter
	cpuSelf, cpuDB   time.Duration
	acquires, waited int64
}

func (s *benchSamples) result(name string) benchResult {
	ms := make([]float64, len(s.lat))
	for i, d := range s.lat {
		ms[i] = float64(d) / float64(time.Millisecond)
	}
	return latencyResult(name, ms, len(ms), s.elapsed)
}

// benchLoad runs op from clients goroutines for a warm-up and then for dur,
// and adds the measured operations to into. Any op error ends the run.
func benchLoad(ctx context.Context, clients int, warm, dur time.Duration, op func(context.Context) error, into *benchSamples) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var measuring, stop atomic.Bool
	lat := make([][]time.Duration, clients)
	var (
		errMu sync.Mutex
		first error
	)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for !stop.Load() {
				t0 := time.Now()
				if err := op(ctx); err != nil {
					errMu.Lock()
					if first == nil && !errors.Is(err, context.Canceled) {
						first = err
					}
					errMu.Unlock()
					cancel()
					return
				}
				if measuring.Load() {
					lat[i] = append(lat[i], time.Since(t0))
				}
			}
		})
	}
	sleep := func(d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	sleep(warm)
	var self0, db0 time.Duration
	var acq0, wait0 int64
	if into.meter != nil {
		self0, db0, acq0, wait0 = into.meter.read()
	}
	measuring.Store(true)
	start := time.Now()
	sleep(dur)
	measuring.Store(false)
	elapsed := time.Since(start)
	if into.meter != nil {
		self1, db1, acq1, wait1 := into.meter.read()
		into.cpuSelf += self1 - self0
		into.cpuDB += db1 - db0
		into.acquires += acq1 - acq0
		into.waited += wait1 - wait0
	}
	stop.Store(true)
	wg.Wait()
	if first != nil {
		return first
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, l := range lat {
		into.lat = append(into.lat, l...)
	}
	into.elapsed += elapsed
	return nil
}

// benchConns is the lean keep-alive client: idle connections in a channel.
type benchConns struct {
	addr string
	idle chan *benchConn
}

type benchConn struct {
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func newBenchConns(addr string, clients int) *benchConns {
	return &benchConns{addr: addr, idle: make(chan *benchConn, clients*2)}
}

func (p *benchConns) close() {
	for {
		select {
		case c := <-p.idle:
			_ = c.c.Close()
		default:
			return
		}
	}
}

func (p *benchConns) post(ctx context.Context, path, key string, want int) error {
	var c *benchConn
	select {
	case c = <-p.idle:
	default:
		nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", p.addr)
		if err != nil {
			return err
		}
		c = &benchConn{c: nc, br: bufio.NewReader(nc), bw: bufio.NewWriter(nc)}
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.c.SetDeadline(dl)
	}
	fmt.Fprintf(c.bw, "POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nX-User: bench\r\n%s: %s\r\ntraceparent: %s\r\nContent-Length: %d\r\n\r\n%s",
		path, idem.HeaderKey, key, benchTraceparent, len(benchHTTPBody), benchHTTPBody)
	err := c.bw.Flush()
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(c.br, nil)
	}
	if err != nil {
		_ = c.c.Close()
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.Close {
		_ = c.c.Close()
	} else {
		select {
		case p.idle <- c:
		default:
			_ = c.c.Close()
		}
	}
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("POST %s: status %d, want %d: %s", path, resp.StatusCode, want, body)
	}
	return nil
}
